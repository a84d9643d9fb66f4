"""Tree speculative sampling: the plain reference.

docs/tree.md ("Tree verification") written in torch, vectorised over the batch: the oracle the
Triton kernel is tested against. The walk down a tree is sequential, so it is a loop over steps in
which every request takes its next step at once: with draft probabilities, one child judged per
step (a walk judges at most M children, each node at most once); target-only, one draw per step
(at most M + 1 along a path). Nothing reads data on the host, so it runs on any device and can be
captured in a CUDA graph; ``cpu.py`` beside it runs the same steps faster on CPU tensors. The
steps are separate functions so that tests can assemble variants (a deliberately broken one).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..core.sampling.probs import sanitize
from ..core.sampling.race import chunk_masses, sample_rows
from ..core.sampling.randomness import request_uniforms
from ..core.sampling.sums import exact_total
from . import slots
from .processed import on_processed_rows


class Tree(NamedTuple):
    """The nodes as the rules read them (rule 1); (B, M) each, index i for node i + 1."""

    token: torch.Tensor  # int64: the node's token, -1 where it is not linked
    parent: torch.Tensor  # int64: the node's parent (0..i), -1 where it is not linked
    duplicate: torch.Tensor  # bool: an earlier sibling carries the same token


def read_tree(draft_token_ids: torch.Tensor, parents: torch.Tensor, vocab: int) -> Tree:
    """Rule 1. Node i + 1 is *linked* when its id is in [0, V) and its parent in [0, i]; it is
    present when it is linked and its parent is present (the root always is). The walk only ever
    looks at the children of nodes it stands on, which are present, so a linked child of theirs is
    present: being linked is all a step needs to know."""
    num_nodes = draft_token_ids.shape[1]
    ids = draft_token_ids.long()
    index = torch.arange(num_nodes, device=ids.device)
    given = parents.long()
    linked = (ids >= 0) & (ids < vocab) & (given >= 0) & (given <= index)
    token = torch.where(linked, ids, -1)
    parent = torch.where(linked, given, -1)
    earlier = index[None, :] < index[:, None]  # [i, k]: node k + 1 comes before node i + 1
    same = ((parent[:, :, None] == parent[:, None, :]) & (token[:, :, None] == token[:, None, :])
            & linked[:, None, :] & earlier)
    return Tree(token, parent, linked & same.any(dim=2))


def next_child(tree: Tree, node: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Index (node - 1) of the first child of ``node`` past index ``after``, per request; M when
    there is none. Children come after their parent, so ``after = -1`` finds the first child."""
    num_nodes = tree.parent.shape[1]
    index = torch.arange(num_nodes, device=node.device)
    is_child = (tree.parent == node[:, None]) & (index > after[:, None])
    return torch.where(is_child, index, num_nodes).amin(dim=1)


def at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b]] for every request b: (B, M) -> (B,)."""
    return values.gather(1, index[:, None]).squeeze(1)


def at_token(probs: torch.Tensor, node: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Sanitised probs[b, node[b], token[b]]: (B, M + 1, V) -> (B,) float32."""
    rows = torch.arange(probs.shape[0], device=probs.device)
    return sanitize(probs[rows, node, token])


class Round(NamedTuple):
    """Where the walk of each request stands while it judges the children of its node (B,)."""

    rejections: torch.Tensor  # int64 j: children of the node rejected so far
    weight: torch.Tensor  # float64 w_j: the residual is relu(w_j p - q) (j >= 1)
    scale: torch.Tensor  # float64 c_j: the draft row now is c_j q, less the rejected tokens
    mass: torch.Tensor  # float64 m_j: the residual's mass (1 for j = 0: p as given)


def fresh_round(batch: int, device) -> Round:
    ones = torch.ones(batch, dtype=torch.float64, device=device)
    return Round(torch.zeros(batch, dtype=torch.int64, device=device), ones, ones, ones)


def residual_rows(p_rows: torch.Tensor, q_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """R = relu(w p - q) of each request's rows, float32 (B, V): w rounded to float32 once,
    product and difference two float32 roundings."""
    return (weight.float()[:, None] * p_rows - q_rows).clamp_min(0.0)


def acceptance_values(p_x: torch.Tensor, q_x: torch.Tensor, state: Round):
    """(p'(x) times the mass of the residual, float32; the scale s = c_j m_j, float64) for a child
    of token x judged after ``state.rejections`` rejections: the child is accepted when
    u q(x) s < the first (rule 4). Before any rejection p' is p itself."""
    residual = (state.weight.float() * p_x - q_x).clamp_min(0.0)
    value = torch.where(state.rejections == 0, p_x, residual)
    return value, state.scale * state.mass


def after_rejection(state: Round, s: torch.Tensor, q_x: torch.Tensor,
                    with_replacement: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule 5: (w_{j+1}, c_{j+1}) in float64 after a rejection at round j."""
    weight = torch.where(state.rejections == 0, 1.0, state.weight / (1.0 + s))
    if with_replacement:
        return weight, state.scale
    remaining = 1.0 - state.scale * q_x.double()  # q drops the rejected token: c / (1 - c q(x))
    scale = torch.where(remaining > 0, state.scale / remaining.clamp_min(1e-300), 0.0)
    return weight, scale


class Walk(NamedTuple):
    """Where each request's walk ended (B,), and the accepted path."""

    node: torch.Tensor  # int64: the node the walk stopped at
    depth: torch.Tensor  # int64: drafts accepted (the path's length)
    path: torch.Tensor  # (B, M) int64: the accepted nodes (1..M) in path order, then -1


def _move(walk: Walk, moving: torch.Tensor, child_index: torch.Tensor) -> Walk:
    """The walks that accept a child (``moving``) step down to it."""
    position = torch.arange(walk.path.shape[1], device=walk.path.device)
    at_depth = moving[:, None] & (position[None, :] == walk.depth[:, None])
    path = torch.where(at_depth, child_index[:, None] + 1, walk.path)
    return Walk(torch.where(moving, child_index + 1, walk.node), walk.depth + moving.long(), path)


def start_walk(batch: int, num_nodes: int, device) -> Walk:
    zeros = torch.zeros(batch, dtype=torch.int64, device=device)
    return Walk(zeros, zeros, torch.full((batch, num_nodes), -1, dtype=torch.int64, device=device))


def residual_mass(p_rows: torch.Tensor, q_rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B,) float64: the exact mass of relu(w p - q) of each pair of rows (as given)."""
    return exact_total(chunk_masses(residual_rows(sanitize(p_rows), sanitize(q_rows), weight)))


def residual_masses(draft_probs, target_probs, node, weight, needed) -> torch.Tensor:
    """(B,) float64: residual_mass at each request's node (used where ``needed``; the reference
    forms every request's rows)."""
    rows = torch.arange(node.shape[0], device=node.device)
    return residual_mass(target_probs[rows, node], draft_probs[rows, node], weight)


def draw_from(p_rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B,) int64: a token of each target row (as given) drawn with the uniforms ``u``
    (B, K + 1) (the inverse-CDF one, then the race's); -1 where the row has no mass."""
    return sample_rows(sanitize(p_rows), u[:, 1:], u[:, 0])


def draws(target_probs, node, u, needed) -> torch.Tensor:
    """(B,) int64: draw_from each request's node's target row (used where ``needed``)."""
    rows = torch.arange(node.shape[0], device=node.device)
    return draw_from(target_probs[rows, node], u)


def never(done: torch.Tensor) -> bool:
    """The reference never asks whether every walk is done: that would read data on the host."""
    return False


def walk_with_drafts(draft_probs, target_probs, tree: Tree, coins: torch.Tensor,
                     with_replacement: bool, judge=acceptance_values, masses=residual_masses,
                     finished=never):
    """Rules 3-5 with draft probabilities: (the walk, its last round). ``judge`` is
    acceptance_values (a parameter so that tests can build a wrong variant); ``masses`` and
    ``finished`` let the CPU backend form only the rows a step needs and stop when every walk
    has."""
    batch, num_nodes = tree.token.shape
    device = target_probs.device
    walk = start_walk(batch, num_nodes, device)
    state = fresh_round(batch, device)
    after = torch.full((batch,), -1, dtype=torch.int64, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(num_nodes + 1):  # each step judges one child; a walk judges at most M
        child = next_child(tree, walk.node, after)
        done = done | (child == num_nodes)  # no child left: the walk stops at its node
        if finished(done):
            break
        judging = ~done
        index = child.clamp(max=num_nodes - 1)
        token = at(tree.token, index).clamp(min=0)
        p_x = at_token(target_probs, walk.node, token)
        q_x = at_token(draft_probs, walk.node, token)
        value, s = judge(p_x, q_x, state)
        coin = at(coins, index)
        accepted = judging & ~at(tree.duplicate, index) & ((coin * q_x).double() * s
                                                            < value.double())
        rejected = judging & ~accepted
        # Rejected: the next residual and its mass; a residual without mass ends the walk.
        weight, scale = after_rejection(state, s, q_x, with_replacement)
        mass = masses(draft_probs, target_probs, walk.node, weight, rejected)
        fresh = fresh_round(batch, device)
        state = Round(*(torch.where(accepted, f, torch.where(rejected, n, o)) for f, n, o in zip(
            fresh, (state.rejections + 1, weight, scale, mass), state)))
        done = done | (rejected & (mass == 0))
        after = torch.where(accepted, -1, torch.where(rejected, index, after))
        walk = _move(walk, accepted, index)
    return walk, state


def walk_target_only(target_probs, tree: Tree, seed, offset, draw=draws, finished=never):
    """Rules 3 and 7, target-only: (the walk, the token drawn where it stopped). At each node one
    draw from its target row (draw r at depth r); the first child carrying that token is taken.
    ``draw`` and ``finished``: as walk_with_drafts's ``masses`` and ``finished``."""
    batch, num_nodes = tree.token.shape
    vocab = target_probs.shape[2]
    device = target_probs.device
    walk = start_walk(batch, num_nodes, device)
    token = torch.full((batch,), -1, dtype=torch.int64, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    index = torch.arange(num_nodes, device=device)
    for r in range(num_nodes + 1):  # one draw per depth
        if finished(done):
            break
        u = request_uniforms(seed, offset, batch, slots.slots_per_draw(vocab),
                             slots.draw_slot(vocab, r))
        drawn = draw(target_probs, walk.node, u, ~done)
        carries = (tree.parent == walk.node[:, None]) & (tree.token == drawn[:, None])
        child = torch.where(carries, index, num_nodes).amin(dim=1)
        moving = ~done & (child < num_nodes)
        token = torch.where(done, token, drawn)
        done = done | ~moving
        walk = _move(walk, moving, child.clamp(max=num_nodes - 1))
    return walk, token


def draw_token(draft_probs, target_probs, walk: Walk, state: Round, seed, offset) -> torch.Tensor:
    """Rule 6 with draft probabilities: draw 0 from the residual of the last round where it has
    rejections and mass, else from p at the node; -1 when that has no mass either."""
    batch, num_nodes = walk.path.shape
    vocab = target_probs.shape[2]
    rows = torch.arange(batch, device=target_probs.device)
    p_rows = sanitize(target_probs[rows, walk.node])
    residual = residual_rows(p_rows, sanitize(draft_probs[rows, walk.node]), state.weight)
    use_residual = (state.rejections > 0) & (state.mass > 0)
    u = request_uniforms(seed, offset, batch, slots.slots_per_draw(vocab), slots.draw_slot(vocab, 0))
    return sample_rows(torch.where(use_residual[:, None], residual, p_rows), u[:, 1:], u[:, 0])


def write_outputs(tree: Tree, walk: Walk, token: torch.Tensor):
    """Rule 8: (output_token_ids (B, M + 1), output_node_ids (B, M), emitted (B,)), int32."""
    batch, num_nodes = walk.path.shape
    path_tokens = tree.token.gather(1, walk.path.clamp(min=1) - 1)
    position = torch.arange(num_nodes + 1, device=token.device)
    padded = torch.nn.functional.pad(torch.where(walk.path > 0, path_tokens, -1), (0, 1), value=-1)
    tokens = torch.where(position == walk.depth[:, None], token[:, None], padded)
    return tokens.int(), walk.path.int(), walk.depth.int()


class Steps(NamedTuple):
    """The steps a backend may form its own way (the CPU backend forms only the rows needed)."""

    masses: Callable  # walk_with_drafts's masses
    draw: Callable  # walk_target_only's draw
    finished: Callable  # both walks' finished
    draw_token: Callable  # rule 6: the token where a walk with draft probabilities stops


PLAIN = Steps(residual_masses, draws, never, draw_token)


def verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset, with_replacement,
           steps: Steps = PLAIN):
    """The rules, with ``steps`` for the steps a backend forms its own way."""
    batch, num_nodes = draft_token_ids.shape
    vocab = target_probs.shape[2]
    tree = read_tree(draft_token_ids, parents, vocab)
    if draft_probs is None:
        walk, token = walk_target_only(target_probs, tree, seed, offset, draw=steps.draw,
                                       finished=steps.finished)
    else:
        coins = request_uniforms(seed, offset, batch, 2 * num_nodes,  # rule 4: node i's coin
                                 slots.coin_slot(vocab, 1))[:, ::2]
        walk, state = walk_with_drafts(draft_probs, target_probs, tree, coins, with_replacement,
                                       masses=steps.masses, finished=steps.finished)
        token = steps.draw_token(draft_probs, target_probs, walk, state, seed, offset)
    return write_outputs(tree, walk, token)


def tree_speculative_sampling_reference(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    with_replacement: bool = True,
):
    """Returns (output_token_ids (B, M + 1), output_node_ids (B, M), emitted (B,)), int32."""
    return verify(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                  with_replacement)


# Verification from logits: every row processed by the rule (core/logits/rule.py), then the above.
tree_speculative_sampling_from_logits_reference = on_processed_rows(
    tree_speculative_sampling_reference)
