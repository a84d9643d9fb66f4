"""The tree kernel against the plain reference, token for token (under TRITON_INTERPRET=1 without
a GPU), and the edge cases docs/tree.md ("Tree verification") defines."""

from __future__ import annotations

import pytest
import torch

from inputs import full_tree, seeds, tree_inputs
from specops.tree.launch import tree_speculative_sampling_triton
from specops.tree.reference import tree_speculative_sampling_reference

pytestmark = pytest.mark.interpreter


def assert_same(draft, ids, parents, target, seed, offset, with_replacement=True):
    expected = tree_speculative_sampling_reference(draft, ids, parents, target, seed, offset,
                                                   with_replacement)
    got = tree_speculative_sampling_triton(draft, ids, parents, target, seed, offset,
                                           with_replacement)
    for e, g in zip(expected, got):
        assert torch.equal(e, g), (expected, got)
    return expected


@pytest.mark.parametrize("batch,num_nodes,vocab", [(6, 5, 7), (4, 9, 1500), (3, 14, 2100),
                                                   (2, 6, 1024)])
@pytest.mark.parametrize("draft,replacement", [(True, True), (True, False), (False, True)])
def test_kernel_matches_reference(batch, num_nodes, vocab, draft, replacement):
    q, d, par, p = tree_inputs(batch, num_nodes, vocab, draft=draft, seed=vocab + num_nodes,
                               sharp=2.0)
    assert_same(q, d, par, p, *seeds(batch, num_nodes % 2 == 0), replacement)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_matches_reference_half_precision(dtype):
    q, d, par, p = tree_inputs(4, 6, 1500, dtype=dtype, ids_dtype=torch.int32,
                               parents_dtype=torch.int32, parents=full_tree(2, 2), seed=3)
    for draft, replacement in ((q, False), (None, True)):
        assert_same(draft, d, par, p, *seeds(4, True, offset_per_request=True), replacement)


@pytest.mark.parametrize("draft", [True, False])
def test_groups_of_chunks(monkeypatch, draft):
    # A pass takes its chunks' masses GROUP at a time; with 2-chunk groups, 5 chunks make full
    # groups and one cut short (the masses, the exact sum and the race run over groups).
    import specops.tree.launch as launch

    monkeypatch.setattr(launch, "GROUP", 2)
    q, d, par, p = tree_inputs(3, 4, 5 * 1024 + 3, draft=draft, seed=1, sharp=1.0)
    assert_same(q, d, par, p, *seeds(3, True), False)


def test_wide_and_deep_trees():
    # 39 nodes (BLOCK_M 64): a full 3-ary tree of depth 3, rows that often agree, many rounds.
    q, d, par, p = tree_inputs(3, 39, 40, parents=full_tree(3, 3), seed=2, sharp=1.0)
    for draft, replacement in ((q, True), (q, False), (None, True)):
        out = assert_same(draft, d, par, p, *seeds(3, False), replacement)
    chain = torch.arange(20)  # a chain of 20 nodes: a deep walk
    q, d, par, p = tree_inputs(2, 20, 9, parents=chain, seed=5, sharp=0.5)
    q[:, :20] = p[:, :20]  # identical models: every draft accepted, the bonus at depth 20
    out = assert_same(q, d, par, p, *seeds(2, True))
    assert out[2].tolist() == [20, 20]


def test_edge_cases_match_reference():
    """Absent nodes (-1, ids >= V, malformed parents, absent parents), duplicate siblings, NaN /
    inf / negative / too large probabilities, rows without mass, identical rows, q(x) = 0."""
    batch, vocab = 10, 6
    q, d, par, p = tree_inputs(batch, 8, vocab, parents=full_tree(2, 2).repeat(2)[:8], seed=9,
                               sharp=1.0)
    d[0, 0] = -1          # the first child of the root absent, and its subtree
    d[1, 1] = vocab + 3   # an id >= V
    par[2, 3] = 7         # malformed: a parent after the node
    par[2, 4] = -4        # malformed: a negative parent
    d[3, 1] = d[3, 0]     # duplicate siblings
    p[4, 0, :3] = float("nan")
    p[4, 1, 2] = float("inf")
    q[5, 0, 1] = -1.0
    p[5, 0, 4] = 2.0**117
    p[6, 0] = 0.0         # the root's row without mass
    p[7] = 0.0            # no mass anywhere: -1
    q[8] = p[8]           # identical models: every residual without mass
    q[9, 0, d[9, 0]] = 0.0  # q(x) = 0 at the first child
    for draft, replacement in ((q, True), (q, False), (None, True)):
        out = assert_same(draft, d, par, p, *seeds(batch, True), replacement)
        assert out[0][7, 0] == -1 and out[2][7] == 0


def test_agreement_over_many_random_requests():
    # Small V keeps the interpreter fast; many requests, random trees, seeds per request.
    for trial, (draft, replacement) in enumerate(((True, True), (True, False), (False, True))):
        q, d, par, p = tree_inputs(20, 6 + 3 * trial, 11 + 7 * trial, draft=draft,
                                   seed=100 + trial, sharp=1.0 + trial)
        d[torch.rand(d.shape, device=d.device) < 0.05] = -1
        assert_same(q, d, par, p, *seeds(20, True, base=trial), replacement)


def test_triton_backend_serves_the_op(monkeypatch):
    import specops

    q, d, par, p = tree_inputs(3, 5, 40, seed=4)
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    called = []
    import specops.tree.launch as launch

    real = launch.tree_speculative_sampling_triton
    monkeypatch.setattr(launch, "tree_speculative_sampling_triton",
                        lambda *a: called.append(1) or real(*a))
    out = specops.tree_speculative_sampling(q, d, par, p, seed=3)
    monkeypatch.setenv("SPECOPS_BACKEND", "torch")
    assert called and all(torch.equal(a, b) for a, b in zip(
        out, specops.tree_speculative_sampling(q, d, par, p, seed=3)))
