"""GPU tests of the tree kernel (skipped without CUDA): opcheck on CUDA, agreement with the
reference at scale, CUDA-graph capture and replay, torch.compile."""

from __future__ import annotations

import pytest
import torch
from graphs import capture, warm_up  # tests/graphs.py
from inputs import full_tree, seeds, tree_inputs  # tests/inputs.py

import specops
from specops.tree.launch import tree_speculative_sampling_triton
from specops.tree.reference import tree_speculative_sampling_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

OP = torch.ops.specops.tree_speculative_sampling


@pytest.mark.parametrize("draft,replacement", [(True, True), (True, False), (False, True)])
def test_opcheck_cuda(draft, replacement):
    q, d, par, p = tree_inputs(4, 14, 5000, draft=draft, parents=full_tree(2, 3))
    seed, offset = seeds(4, True)
    torch.library.opcheck(OP.default, (q, d, par, p, seed, offset, replacement))


@pytest.mark.parametrize("batch,num_nodes,vocab,dtype,draft,replacement", [
    (1, 30, 128256, torch.bfloat16, True, True), (64, 14, 32000, torch.float32, True, False),
    (256, 39, 32000, torch.float16, False, True), (600, 6, 4097, torch.float32, True, True),
])
def test_matches_reference_large(batch, num_nodes, vocab, dtype, draft, replacement):
    q, d, par, p = tree_inputs(batch, num_nodes, vocab, dtype=dtype, draft=draft, sharp=1.0)
    seed, offset = seeds(batch, True)
    expected = tree_speculative_sampling_reference(q, d, par, p, seed, offset, replacement)
    got = tree_speculative_sampling_triton(q, d, par, p, seed, offset, replacement)
    differ = torch.zeros(batch, dtype=torch.bool, device=p.device)
    for e, g in zip(expected, got):
        differ |= (e != g).reshape(batch, -1).any(dim=1)
    assert int(differ.sum()) <= max(1, batch // 100)  # float32 race-key ties: rare


def test_cuda_graph_capture_and_replay():
    batch, vocab = 16, 32000
    q, d, par, p = tree_inputs(batch, 14, vocab, dtype=torch.bfloat16, parents=full_tree(2, 3),
                               sharp=1.0)
    seed = torch.tensor([11], device="cuda")
    offset = torch.tensor([0], device="cuda")

    def step():
        return OP(q, d, par, p, seed, offset, False)

    def step_unseeded():
        return specops.tree_speculative_sampling(None, d, par, p)

    warm_up(step, step_unseeded)

    graph, out = capture(step)
    for new_offset in (0, 1, 2):
        offset.fill_(new_offset)
        graph.replay()
        expected = tree_speculative_sampling_reference(q, d, par, p, seed, offset, False)
        assert all(torch.equal(a, b) for a, b in zip(out, expected))

    graph2, out2 = capture(step_unseeded)
    seen = set()
    for _ in range(4):
        graph2.replay()
        seen.add(tuple(out2[0].flatten().tolist()))
    assert len(seen) > 1  # fresh randomness on every replay


def test_torch_compile_fullgraph():
    q, d, par, p = tree_inputs(8, 14, 32000, parents=full_tree(2, 3))

    def step(q, d, par, p):
        return specops.tree_speculative_sampling(q, d, par, p, seed=5)

    compiled = torch.compile(step, fullgraph=True)
    assert all(torch.equal(a, b) for a, b in zip(compiled(q, d, par, p), step(q, d, par, p)))


# Traversal verification's kernel (docs/tree.md, "Traversal verification").


@pytest.mark.parametrize("replacement", [True, False])
def test_traversal_opcheck_cuda(replacement):
    q, d, par, p = tree_inputs(4, 14, 5000, parents=full_tree(2, 3))
    seed, offset = seeds(4, True)
    torch.library.opcheck(OP.default, (q, d, par, p, seed, offset, replacement, "traversal"))


@pytest.mark.parametrize("batch,num_nodes,vocab,dtype,replacement", [
    (1, 30, 128256, torch.bfloat16, True), (64, 14, 32000, torch.float32, False),
    (600, 6, 4097, torch.float16, True),
])
def test_traversal_matches_reference_large(batch, num_nodes, vocab, dtype, replacement):
    from specops.tree import traversal_reference as reference
    from specops.tree.launch import tree_traversal_triton

    q, d, par, p = tree_inputs(batch, num_nodes, vocab, dtype=dtype, sharp=1.0)
    seed, offset = seeds(batch, True)
    expected = reference.verify(q, d, par, p, seed, offset, replacement)
    got = tree_traversal_triton(q, d, par, p, seed, offset, replacement)
    differ = torch.zeros(batch, dtype=torch.bool, device=p.device)
    for e, g in zip(expected, got):
        differ |= (e != g).reshape(batch, -1).any(dim=1)
    assert int(differ.sum()) <= max(1, batch // 100)  # float32 race-key ties: rare


def test_traversal_cuda_graph_capture_and_replay():
    from specops.tree import traversal_reference as reference

    q, d, par, p = tree_inputs(16, 14, 32000, dtype=torch.bfloat16, parents=full_tree(2, 3),
                               sharp=1.0)
    seed = torch.tensor([11], device="cuda")
    offset = torch.tensor([0], device="cuda")

    def step():
        return OP(q, d, par, p, seed, offset, False, "traversal")

    warm_up(step)
    graph, out = capture(step)
    for new_offset in (0, 1, 2):
        offset.fill_(new_offset)
        graph.replay()
        expected = reference.verify(q, d, par, p, seed, offset, False)
        assert all(torch.equal(a, b) for a, b in zip(out, expected))
