"""GPU tests of block verification's Triton kernels (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from graphs import capture, warm_up  # tests/graphs.py
from inputs import make_inputs, seeds  # tests/inputs.py

import specops
from specops.chain.block.launch import block_speculative_sampling_triton
from specops.chain.block.reference import block_speculative_sampling_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

OP = torch.ops.specops.chain_block_speculative_sampling


def counters(batch):
    return (torch.zeros(batch, dtype=torch.int32, device="cuda"),
            torch.zeros(batch, dtype=torch.int64, device="cuda"))


def test_opcheck_cuda():
    q, ids, target = make_inputs(4, 3, 5000)
    acc, emit = counters(4)
    seed, offset = seeds(4, True)
    torch.library.opcheck(OP.default, (q, ids, target, acc, emit, seed, offset, True))


@pytest.mark.parametrize("batch,num_draft,vocab,dtype,draft", [
    (1, 4, 128256, torch.bfloat16, True), (64, 5, 32000, torch.float32, True),
    (8, 2, 50000, torch.float16, False), (200, 1, 4097, torch.float32, True),
])
def test_matches_reference_large(batch, num_draft, vocab, dtype, draft):
    q, ids, target = make_inputs(batch, num_draft, vocab, dtype=dtype, draft=draft)
    seed, offset = seeds(batch, True)
    a1, e1 = counters(batch)
    a2, e2 = counters(batch)
    ref = block_speculative_sampling_reference(q, ids, target, a1, e1, seed, offset)
    out = block_speculative_sampling_triton(q, ids, target, a2, e2, seed, offset)
    assert (out != ref).any(1).sum() <= max(1, batch // 100)  # float32 rank ties: rare
    assert torch.equal(a1, a2)


def test_cuda_graph_capture_and_replay():
    batch, num_draft, vocab = 16, 4, 32000
    q, ids, target = make_inputs(batch, num_draft, vocab, dtype=torch.bfloat16)
    acc, emit = counters(batch)
    seed = torch.tensor([11], device="cuda")
    offset = torch.tensor([0], device="cuda")

    def step():
        return OP(q, ids, target, acc, emit, seed, offset)

    def step_unseeded():
        return specops.chain_speculative_sampling(q, ids, target, acc, emit, verification="block")[0]

    warm_up(step, step_unseeded)

    graph, out = capture(step)
    for new_offset in (0, 1, 2):
        offset.fill_(new_offset)
        acc.zero_()
        emit.zero_()
        graph.replay()
        a_ref, e_ref = counters(batch)
        ref = block_speculative_sampling_reference(q, ids, target, a_ref, e_ref, seed, offset)
        assert torch.equal(out, ref) and torch.equal(acc, a_ref) and torch.equal(emit, e_ref)

    graph2, out2 = capture(step_unseeded)
    seen = set()
    for _ in range(4):
        graph2.replay()
        seen.add(tuple(out2.flatten().tolist()))
    assert len(seen) > 1  # fresh randomness on every replay


def test_torch_compile_fullgraph():
    q, ids, target = make_inputs(8, 3, 32000)

    def step(q, ids, target):
        return specops.chain_speculative_sampling(q, ids, target, seed=5, verification="block")[0]

    assert torch.equal(torch.compile(step, fullgraph=True)(q, ids, target), step(q, ids, target))
