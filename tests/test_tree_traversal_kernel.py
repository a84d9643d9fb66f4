"""The traversal kernel against the plain reference, token for token (under TRITON_INTERPRET=1
without a GPU), on trees of every shape and the edge cases of test_tree_traversal.py."""

from __future__ import annotations

import pytest
import torch

from inputs import full_tree, seeds, tree_inputs
from specops.tree import traversal_reference as reference
from specops.tree.launch import tree_traversal_triton

import test_tree_traversal as traversal_tests  # tests/test_tree_traversal.py: its trees

pytestmark = pytest.mark.interpreter


def assert_same(draft, ids, parents, target, seed, offset, with_replacement=True):
    expected = reference.verify(draft, ids, parents, target, seed, offset, with_replacement)
    got = tree_traversal_triton(draft, ids, parents, target, seed, offset, with_replacement)
    for e, g in zip(expected, got):
        assert torch.equal(e, g), (expected, got)
    return expected


@pytest.mark.parametrize("batch,num_nodes,vocab", [(6, 5, 7), (4, 9, 1500), (3, 14, 2100)])
@pytest.mark.parametrize("replacement", [True, False])
def test_kernel_matches_reference(batch, num_nodes, vocab, replacement):
    q, d, par, p = tree_inputs(batch, num_nodes, vocab, seed=vocab + num_nodes, sharp=2.0)
    assert_same(q, d, par, p, *seeds(batch, num_nodes % 2 == 0), replacement)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_matches_reference_half_precision(dtype):
    q, d, par, p = tree_inputs(4, 6, 1500, dtype=dtype, ids_dtype=torch.int32,
                               parents_dtype=torch.int32, parents=full_tree(2, 2), seed=3)
    assert_same(q, d, par, p, *seeds(4, True, offset_per_request=True), False)


def test_groups_of_chunks(monkeypatch):
    # A pass takes its chunks' masses GROUP at a time; with 2-chunk groups, 5 chunks make full
    # groups and one cut short.
    import specops.tree.launch as launch  # the tree kernels' launch

    monkeypatch.setattr(launch, "GROUP", 2)
    q, d, par, p = tree_inputs(3, 4, 5 * 1024 + 3, seed=1, sharp=1.0)
    assert_same(q, d, par, p, *seeds(3, True), False)


def test_wide_and_deep_trees():
    # 39 nodes (BLOCK_M 64): a full 3-ary tree of depth 3 whose rows often agree; a chain of 20.
    q, d, par, p = tree_inputs(3, 39, 40, parents=full_tree(3, 3), seed=2, sharp=1.0)
    for replacement in (True, False):
        assert_same(q, d, par, p, *seeds(3, False), replacement)
    q, d, par, p = tree_inputs(2, 20, 9, parents=torch.arange(20), seed=5, sharp=0.5)
    assert_same(q, d, par, p, *seeds(2, True), True)


def test_edge_cases_match_reference():
    """Absent nodes, duplicate siblings, a root without mass, a root whose draft is its target."""
    for trial in range(2):
        q, ids, parents, p = traversal_tests.random_trees(trial, vocab=40)
        seed, offset = torch.arange(8) * 13 + trial, torch.tensor([trial])
        for replacement in (True, False):
            assert_same(q, ids, parents, p, seed, offset, replacement)


def test_triton_backend_serves_the_op_from_probabilities_and_logits(monkeypatch):
    import specops
    import specops.tree.launch as launch

    q, d, par, p = tree_inputs(3, 6, 40, parents=full_tree(2, 2), seed=4)
    launched = []  # the kernel of each launch
    real = launch.launch
    monkeypatch.setattr(launch, "launch", lambda kernel, *a, **k: launched.append(kernel.fn)
                        or real(kernel, *a, **k))
    calls = (lambda: specops.tree_speculative_sampling(q, d, par, p, seed=3,
                                                       verification="traversal"),
             lambda: specops.tree_speculative_sampling_from_logits(
                 None, d, par, p.log(), draft_logits=q.log(), temperature=0.8, seed=3,
                 with_replacement=False, verification="traversal"))
    for call in calls:
        monkeypatch.setenv("SPECOPS_BACKEND", "triton")
        out = call()
        monkeypatch.setenv("SPECOPS_BACKEND", "torch")
        assert all(torch.equal(a, b) for a, b in zip(out, call()))
    assert launched == [launch.tree_traversal_kernel] * 2
