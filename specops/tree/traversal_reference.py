"""Traversal verification of a tree: the plain reference.

docs/tree.md ("Traversal verification") written in torch, vectorised over the batch, on the tree
reference's steps (reference.py): the oracle the Triton kernel (traversal_kernel.py) is tested
against; the CPU backend is it with cpu.py's steps. The traversal is sequential, so it is a loop over steps in
which every request takes its next step at once; a step descends to a child, rejects a node (one
pass over its parent's row pair), or ends the traversal, so a request takes at most 2M + 1 steps.
Nothing reads data on the host. The steps are separate functions so that tests can assemble
variants (a deliberately broken one).

Each node's state (``Nodes``) is the acceptance value a of the path from the root to it, and the
residual its rejected children have left, B = relu(w p - q) / m after k >= 1
rejections (p as given before any), with the draft's row Q = s q (s > 1 once tokens drawn without
replacement are removed). A rejection at a node U maps them, in float64, to

    w' = a (k = 0) or a w / (a + s m),   m' = the exact mass of relu(w' p - q),
    S = s m' (k = 0) or (a / m + s) m',  a' = S / (S + 1 - a),   s' = s / (1 - s q(x)) (without
    replacement; s' = s i.i.d.), k' = k + 1,

which is [a B - Q]_+ and its mass, kept as one scalar weight over the node's rows as given.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .reference import (Round, Tree, Walk, at, at_token, draw_token, read_tree, residual_masses,
                        start_walk, write_outputs, never, next_child)
from ..core.sampling.randomness import request_uniforms
from . import slots


class Nodes(NamedTuple):
    """Every node's state (B, M + 1); column 0 is the root."""

    value: torch.Tensor  # float64 a: the node's acceptance value (the root's is 1)
    rejections: torch.Tensor  # int64 k: children of the node rejected so far
    weight: torch.Tensor  # float64 w: its residual is relu(w p - q) / m (k >= 1)
    mass: torch.Tensor  # float64 m: that residual's exact mass
    scale: torch.Tensor  # float64 s: its draft row is s q, less the tokens removed
    after: torch.Tensor  # int64: the index (node - 1) of its last child handled, -1 for none


def fresh_nodes(batch: int, num_nodes: int, device) -> Nodes:
    ones = torch.ones(batch, num_nodes + 1, dtype=torch.float64, device=device)
    zeros = torch.zeros(batch, num_nodes + 1, dtype=torch.int64, device=device)
    return Nodes(ones, zeros, ones, ones, ones, zeros - 1)


def state_at(nodes: Nodes, node: torch.Tensor) -> Nodes:
    """Each request's node's state, (B,) per field."""
    return Nodes(*(at(field, node) for field in nodes))


def with_state(nodes: Nodes, node: torch.Tensor, state: Nodes, where: torch.Tensor) -> Nodes:
    """``nodes`` with ``state`` (B,) written at each request's ``node`` where ``where``."""
    column = torch.arange(nodes.value.shape[1], device=node.device)
    here = where[:, None] & (column[None, :] == node[:, None])
    return Nodes(*(torch.where(here, new[:, None], old) for new, old in zip(state, nodes)))


def child_value(state: Nodes, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """(B,) float64: a child's acceptance value min(1, a B(x) / Q(x)) for its token x, from its
    parent's ``state`` and the parent's rows at x (float32): B(x) is p(x) before any rejection,
    relu(w p(x) - q(x)) / m after; Q(x) = s q(x). 1 where Q(x) = 0 < a B(x) (the block rule's)."""
    first = state.rejections == 0
    value = torch.where(first, p_x, (state.weight.float() * p_x - q_x).clamp_min(0.0))
    num = state.value * value.double()
    den = torch.where(first, 1.0, state.mass) * state.scale * q_x.double()
    return torch.where(num < den, num / den, (num > 0).double())


def weight_after_rejection(state: Nodes) -> torch.Tensor:
    """(B,) float64 w' of the module docstring: [a B - Q]_+ = factor * relu(w' p - q)."""
    return torch.where(state.rejections == 0, state.value,
                       state.value * state.weight / (state.value + state.scale * state.mass))


def after_rejection(state: Nodes, weight: torch.Tensor, mass: torch.Tensor, q_x: torch.Tensor,
                    with_replacement: bool) -> Nodes:
    """A node's state after one of its children (token x, the parent's draft value there
    ``q_x``) is rejected, given w' and the exact mass m' of relu(w' p - q) (module docstring)."""
    first = state.rejections == 0
    factor = torch.where(first, state.scale,
                         state.value / torch.where(first, 1.0, state.mass) + state.scale)
    total = factor * mass
    denominator = total + (1.0 - state.value)
    value = torch.where(denominator > 0, total / torch.where(denominator > 0, denominator, 1.0),
                        0.0)
    scale = state.scale
    if not with_replacement:  # Q drops the rejected token: s / (1 - s q(x))
        remaining = 1.0 - state.scale * q_x.double()
        scale = torch.where(remaining > 0, state.scale / remaining.clamp_min(1e-300), 0.0)
    return Nodes(value, state.rejections + 1, weight, mass, scale, state.after)


def _descend(walk: Walk, moving: torch.Tensor, child_index: torch.Tensor) -> Walk:
    position = torch.arange(walk.path.shape[1], device=walk.path.device)
    at_depth = moving[:, None] & (position[None, :] == walk.depth[:, None])
    path = torch.where(at_depth, child_index[:, None] + 1, walk.path)
    return Walk(torch.where(moving, child_index + 1, walk.node), walk.depth + moving.long(), path)


def _ascend(walk: Walk, moving: torch.Tensor, parent: torch.Tensor) -> Walk:
    position = torch.arange(walk.path.shape[1], device=walk.path.device)
    at_depth = moving[:, None] & (position[None, :] == walk.depth[:, None] - 1)
    path = torch.where(at_depth, -1, walk.path)
    return Walk(torch.where(moving, parent, walk.node), walk.depth - moving.long(), path)


def traverse(draft_probs, target_probs, tree: Tree, coins: torch.Tensor, with_replacement: bool,
             value_of=child_value, masses=residual_masses, finished=never):
    """The traversal (docs/tree.md, "Traversal verification"): (the walk where it ended, the
    state of the node it ended at). ``value_of`` is child_value (a parameter so that tests can
    build a wrong variant); ``masses`` and ``finished`` let the CPU backend form only the rows a
    step needs and stop when every traversal has ended."""
    batch, num_nodes = tree.token.shape
    device = target_probs.device
    walk = start_walk(batch, num_nodes, device)
    nodes = fresh_nodes(batch, num_nodes, device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    parent_of = torch.nn.functional.pad(tree.parent.clamp(min=0), (1, 0))  # (B, M + 1)
    for _ in range(2 * num_nodes + 1):  # M descents, M rejections, one end
        if finished(done):
            break
        node = walk.node
        state = state_at(nodes, node)
        root = node == 0
        # A node whose value is 0 is rejected with all that is left below it.
        dead = ~done & ~root & (state.value == 0)
        child = next_child(tree, node, state.after)
        has_child = ~done & ~dead & (child < num_nodes)
        index = child.clamp(max=num_nodes - 1)
        token = at(tree.token, index).clamp(min=0)
        p_x = at_token(target_probs, node, token)
        q_x = at_token(draft_probs, node, token)
        value = torch.where(at(tree.duplicate, index), 0.0, value_of(state, p_x, q_x))
        descend = has_child & (value > 0)
        leaf = ~done & ~dead & (child == num_nodes)
        coin = at(coins, (node - 1).clamp(min=0))
        accept = leaf & (root | (coin.double() < state.value))
        # A rejection updates the node a child of which is rejected: this node (a child whose
        # value is 0, rejected in place) or its parent (this node, rejected).
        in_place = has_child & (value == 0)
        popped = dead | (leaf & ~accept)
        rejecting = in_place | popped
        upper = torch.where(popped, at(parent_of, node), node)
        rejected = torch.where(popped, node - 1, index)  # the rejected child's index
        rejected_token = at(tree.token, rejected.clamp(min=0)).clamp(min=0)
        upper_state = state_at(nodes, upper)
        q_rejected = at_token(draft_probs, upper, rejected_token)
        live = rejecting & (upper_state.value > 0)  # a node of value 0 is left as it is
        weight = weight_after_rejection(upper_state)
        mass = masses(draft_probs, target_probs, upper, weight, live)
        updated = after_rejection(upper_state, weight, mass, q_rejected, with_replacement)
        updated = updated._replace(after=rejected)
        kept = upper_state._replace(after=rejected)
        nodes = with_state(nodes, upper, updated, live)
        nodes = with_state(nodes, upper, kept, rejecting & ~live)
        # The child descended to starts fresh, with its value.
        ones = torch.ones_like(value)
        fresh = Nodes(value, torch.zeros_like(node), ones, ones, ones, torch.full_like(node, -1))
        nodes = with_state(nodes, index + 1, fresh, descend)
        walk = _descend(walk, descend, index)
        walk = _ascend(walk, popped, upper)
        done = done | accept
    return walk, state_at(nodes, walk.node)


def verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset, with_replacement,
           masses=residual_masses, finished=never, draw=draw_token):
    """Traversal verification with draft probabilities; ``masses``, ``finished`` and ``draw``:
    the steps a backend forms its own way (tree/reference.py's Steps)."""
    batch, num_nodes = draft_token_ids.shape
    vocab = target_probs.shape[2]
    tree = read_tree(draft_token_ids, parents, vocab)
    coins = request_uniforms(seed, offset, batch, 2 * num_nodes,  # node i's coin, as rule 4's
                             slots.coin_slot(vocab, 1))[:, ::2]
    walk, state = traverse(draft_probs, target_probs, tree, coins, with_replacement,
                           masses=masses, finished=finished)
    # The token is drawn from the residual the node's rejections left, else from p there.
    last = Round(state.rejections, state.weight, state.scale, state.mass)
    token = draw(draft_probs, target_probs, walk, last, seed, offset)
    return write_outputs(tree, walk, token)
