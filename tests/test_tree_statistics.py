"""Tree verification is exact, sequence by sequence, and keeps more tokens than a chain.

Small static worlds: the target's and the draft's rows depend on the absolute position alone
(P_t, Q_t), so the target's sequences are independent tokens, token t drawn from P_t. Whole
sequences are decoded by repeated calls; each call builds a full tree by the declared sampling
(every node's children drawn i.i.d. from its draft row, or without replacement, or the draft row's
top-k for target-only verification), and the chi-square test compares the joint distribution of the
first LENGTH tokens with the product of the target rows. A variant that judges every child against
p instead of the residual must fail the same test (the detector detects). Fixed seeds:
deterministic.
"""

from __future__ import annotations

import pytest
import torch

import specops
from specops.tree import reference, slots
from specops.demo.stats import chi2_pvalue

import worlds  # tests/worlds.py
from inputs import full_tree  # tests/inputs.py

P_THRESHOLD = 1e-4
LENGTH = 3  # tokens of each sequence whose joint distribution is tested
SEQUENCES = 20000


def make_world(vocab: int, depth: int, seed: int, scale: float):
    """Target and draft rows for the positions a sequence of LENGTH tokens can reach."""
    return worlds.make_world(vocab, LENGTH + depth + 1, seed, scale)


def depths(parents: torch.Tensor) -> torch.Tensor:
    """(M + 1,) depth of every node of one tree, the root's 0."""
    depth = [0]
    for parent in parents.tolist():
        depth.append(depth[parent] + 1)
    return torch.tensor(depth)


def draw(rows: torch.Tensor, generator) -> torch.Tensor:
    """One token per row of (not necessarily normalised) weights, by inverse CDF of torch.rand
    (whose stream, unlike torch.multinomial's, is the same in every torch release)."""
    u = torch.rand(rows.shape[0], 1, generator=generator, dtype=torch.float64)
    below = (rows.cumsum(-1) < u * rows.sum(-1, keepdim=True)).sum(-1)
    return below.clamp_max(rows.shape[-1] - 1)


def children_tokens(q_rows: torch.Tensor, width: int, mode: str, generator) -> torch.Tensor:
    """(R, width) children tokens of R nodes with draft rows q_rows (R, V): drawn i.i.d., drawn
    one after another without replacement, or the top-k tokens (ties to the lower token)."""
    if mode == "top-k":
        order = torch.sort(-q_rows, dim=-1, stable=True).indices
        return order[:, :width]
    left = q_rows.clone()
    tokens = []
    for _ in range(width):
        token = draw(left, generator)
        tokens.append(token)
        if mode == "without":
            left[torch.arange(left.shape[0]), token] = 0.0
    return torch.stack(tokens, dim=1)


def tree_op(mode):
    """The public function for a tree built by ``mode``'s sampling."""
    def run(draft_probs, ids, parents, target_probs, seed, offset):
        return specops.tree_speculative_sampling(
            None if mode == "top-k" else draft_probs, ids, parents, target_probs, seed=seed,
            offset=offset, with_replacement=mode != "without")
    return run


def broken_op(mode):
    """Tree verification whose every child is judged against p instead of the residual (the
    residual after the last rejection is still the one drawn from)."""
    def run(draft_probs, ids, parents, target_probs, seed, offset):
        seed, offset = torch.tensor([seed]), torch.tensor([offset])
        tree = reference.read_tree(ids, parents, target_probs.shape[2])
        coins = reference.request_uniforms(seed, offset, ids.shape[0], 2 * ids.shape[1],
                                           slots.coin_slot(target_probs.shape[2], 1))[:, ::2]
        walk, state = reference.walk_with_drafts(
            draft_probs, target_probs, tree, coins, mode != "without",
            judge=lambda p_x, q_x, state: (p_x, torch.ones_like(state.mass)))
        token = reference.draw_token(draft_probs, target_probs, walk, state, seed, offset)
        return reference.write_outputs(tree, walk, token)
    return run


def build_trees(p, q, length, width, depth, mode, generator):
    """Trees for requests at sequence lengths ``length`` (R,): (draft_probs, ids, parents,
    target_probs), rows by absolute position."""
    parents = full_tree(width, depth)
    node_depth = depths(parents)
    rows = length[:, None] + node_depth[None, :]  # (R, M + 1) absolute positions
    target = p.float()[rows]
    draft = q.float()[rows]
    ids = torch.zeros(length.shape[0], parents.shape[0], dtype=torch.int64)
    for node in range(parents.shape[0] + 1):
        kids = (parents == node).nonzero().squeeze(1)
        if kids.numel():
            ids[:, kids] = children_tokens(draft[:, node].double(), kids.numel(), mode, generator)
    return draft, ids, parents.expand(length.shape[0], -1), target


def decode(op, p, q, width, depth, mode, seed):
    """LENGTH tokens of SEQUENCES sequences decoded by repeated calls: (tokens, calls, emitted)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((SEQUENCES, LENGTH + depth + 1), -1, dtype=torch.int64)
    length = torch.zeros(SEQUENCES, dtype=torch.int64)
    step = 0
    while bool((length < LENGTH).any()):
        active = (length < LENGTH).nonzero().squeeze(1)
        n = length[active]
        draft, ids, parents, target = build_trees(p, q, n, width, depth, mode, g)
        out, _, _ = op(draft, ids, parents, target, 1000 + seed * 100 + step, step)
        out = out[:, : depth + 1].long()
        kept = (out >= 0).sum(1)
        cols = n[:, None] + torch.arange(depth + 1)
        old = tokens[active[:, None], cols]
        tokens[active[:, None], cols] = torch.where(out >= 0, out, old)
        length[active] += kept
        step += 1
    return tokens[:, :LENGTH]


# (V, width, depth, seed, scale): a binary tree of depth 3 and a ternary one of depth 2. In both,
# judging children against p instead of the residual is off by far more than 20000 sequences can
# tell (p-values below 1e-100 in every world tried).
WORLDS = [(4, 2, 3, 3, 2.0), (5, 3, 2, 1, 2.0)]


@pytest.mark.parametrize("mode", ["iid", "without", "top-k"])
@pytest.mark.parametrize("vocab,width,depth,seed,scale", WORLDS)
def test_sequences_follow_the_target(mode, vocab, width, depth, seed, scale):
    p, q = make_world(vocab, depth, seed, scale)
    tokens = decode(tree_op(mode), p, q, width, depth, mode, seed)
    assert worlds.joint_pvalue(tokens, p) > P_THRESHOLD


@pytest.mark.parametrize("mode,world", [("iid", WORLDS[0]), ("without", WORLDS[1])])
def test_detector_catches_children_judged_against_p(mode, world):
    vocab, width, depth, seed, scale = world
    p, q = make_world(vocab, depth, seed, scale)
    tokens = decode(broken_op(mode), p, q, width, depth, mode, seed)
    assert worlds.joint_pvalue(tokens, p) < P_THRESHOLD


# ----------------------------------------------------------------------------------------------
# A chain of nodes, target-only, has the chain op's distribution (with draft probabilities it has
# the chain op's very tokens: tests/test_tree_op.py).


def test_target_only_chain_has_the_chain_ops_distribution():
    """Drafts fixed, rows fixed: (emitted e, the token at e) has P(e = k, y) = p_0(d_0) ...
    p_{k-1}(d_{k-1}) p_k(y) for y != d_k (p_N(y) at the end), for the tree op target-only and for
    the chain op with draft_probs=None, whose rules differ (a coin, then p less d) but not their
    distribution."""
    vocab, num_draft, requests = 5, 3, 20000
    p, _ = make_world(vocab, num_draft - LENGTH, 11, 1.0)
    d = torch.tensor([int(p[j].argmax()) for j in range(num_draft)])  # likely drafts
    reach = torch.cumprod(torch.cat([torch.ones(1, dtype=torch.float64),
                                     p[torch.arange(num_draft), d]]), 0)
    expected = reach[:, None] * p[: num_draft + 1]
    expected[torch.arange(num_draft), d] = 0.0
    target = p[: num_draft + 1].float().expand(requests, -1, -1)
    ids = d.expand(requests, -1)
    tree, _, _ = specops.tree_speculative_sampling(None, ids, torch.arange(num_draft).expand(
        requests, -1), target, seed=5)
    chain, _, _ = specops.chain_speculative_sampling(None, ids, target, seed=5)
    for out in (tree, chain):
        e = (out >= 0).sum(1) - 1
        token = out.long().gather(1, e[:, None]).squeeze(1)
        counts = torch.bincount(e * vocab + token, minlength=(num_draft + 1) * vocab)
        assert chi2_pvalue(counts, expected.flatten()) > P_THRESHOLD


# ----------------------------------------------------------------------------------------------
# A tree keeps at least as many tokens per call as its first-child chain, and more on average.


def first_child_chain(parents: torch.Tensor) -> torch.Tensor:
    """(M,) bool: the nodes of the chain root, its first child, that one's first child, ..."""
    keep = torch.zeros(parents.shape[0], dtype=torch.bool)
    node = 0
    while bool((parents == node).any()):
        node = int((parents == node).nonzero()[0]) + 1
        keep[node - 1] = True
    return keep


@pytest.mark.parametrize("mode", ["iid", "without", "top-k"])
def test_tree_keeps_at_least_its_first_child_chains_tokens(mode):
    """The same call on the tree and on its first-child chain (the other nodes absent, so every
    node keeps its index and its coin): at every node the chain's walk judges the first child as
    the tree's does, and where the chain stops the tree may go on, so the tree emits at least as
    many drafts in every request, and more on average."""
    gains = []
    for world in range(6):
        p, q = make_world(4 + world % 2, 3, 20 + world, 0.5 + world / 2)
        draft, ids, parents, target = build_trees(p, q, torch.zeros(3000, dtype=torch.int64),
                                                  2 + world % 2, 3, mode,
                                                  torch.Generator().manual_seed(world))
        chain_ids = torch.where(first_child_chain(parents[0]), ids, -1)
        op = tree_op(mode)
        _, _, tree = op(draft, ids, parents, target, 7 + world, 0)
        _, _, chain = op(draft, chain_ids, parents, target, 7 + world, 0)
        assert bool((tree >= chain).all()), (mode, world)
        gains.append(float((tree - chain).float().mean()))
    assert min(gains) > 0.02, gains
