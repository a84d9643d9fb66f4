"""GPU tests of the Triton kernel (skipped without CUDA; benchmarks/gpu_check.py runs them)."""

from __future__ import annotations

import pytest
import torch
from graphs import capture, warm_up  # tests/graphs.py
from inputs import make_inputs, seeds  # tests/inputs.py

import specops
from specops.chain.token.launch import chain_speculative_sampling_triton
from specops.chain.token.reference import chain_speculative_sampling_reference
from specops.demo.stats import chi2_pvalue

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def op_args(batch, device="cuda", per_request=True):
    seed, offset = seeds(batch, per_request, offset_per_request=per_request, device=device)
    acc = torch.zeros(batch, dtype=torch.int32, device=device)
    emit = torch.zeros(batch, dtype=torch.int64, device=device)
    return acc, emit, seed, offset


def test_opcheck_cuda():
    draft, ids, target = make_inputs(4, 3, 5000)
    acc, emit, seed, offset = op_args(4)
    torch.library.opcheck(torch.ops.specops.chain_speculative_sampling.default,
                          (draft, ids, target, acc, emit, seed, offset))
    torch.library.opcheck(torch.ops.specops.chain_speculative_sampling.default,
                          (None, ids, target, acc, emit, seed[:1], offset[:1]))


def test_default_backend_is_triton_on_cuda(monkeypatch):
    import specops.chain.token.launch as module

    calls = []
    original = module.chain_speculative_sampling_triton
    monkeypatch.setattr(module, "chain_speculative_sampling_triton",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.delenv("SPECOPS_BACKEND", raising=False)
    draft, ids, target = make_inputs(2, 2, 3000)
    specops.chain_speculative_sampling(draft, ids, target, seed=1)
    assert calls


def test_torch_compile_fullgraph():
    draft, ids, target = make_inputs(8, 4, 32000, dtype=torch.bfloat16)

    def step(draft, ids, target, acc, emit, seed, offset):
        return torch.ops.specops.chain_speculative_sampling(draft, ids, target, acc, emit, seed, offset)

    compiled = torch.compile(step, fullgraph=True)
    acc1, emit1, seed, offset = op_args(8)
    acc2, emit2 = acc1.clone(), emit1.clone()
    out1 = compiled(draft, ids, target, acc1, emit1, seed, offset)
    out2 = step(draft, ids, target, acc2, emit2, seed, offset)
    assert torch.equal(out1, out2) and torch.equal(acc1, acc2) and torch.equal(emit1, emit2)


@pytest.mark.parametrize("batch, num_draft, vocab, dtype, draft", [
    (1024, 4, 32000, torch.float32, True),
    (256, 8, 128256, torch.bfloat16, True),
    (64, 1, 151936, torch.float16, False),
    (3, 5, 152064, torch.float32, True),  # split over many programs
])
def test_matches_reference_large(batch, num_draft, vocab, dtype, draft):
    q, ids, target = make_inputs(batch, num_draft, vocab, dtype=dtype, draft=draft, seed=batch)
    ids[::7, -1] = -1
    outs = []
    for fn in (chain_speculative_sampling_reference, chain_speculative_sampling_triton):
        acc, emit, seed, offset = op_args(batch)
        outs.append((fn(q, ids, target, acc, emit, seed, offset), acc, emit))
    (o1, a1, e1), (o2, a2, e2) = outs
    mismatch = (o1 != o2).any(dim=1) | (a1 != a2) | (e1 != e2)
    # Summation order differs (float32 chunk masses, float64 prefix sums): a flipped race is
    # ~1e-7 likely per request (docs/internals/kernel.md), so none is expected at this size.
    assert int(mismatch.sum()) == 0


def test_split_independence_gpu():
    q, ids, target = make_inputs(2, 3, 128256, seed=5)
    acc, emit, seed, offset = op_args(2)
    outs = [chain_speculative_sampling_triton(q, ids, target, acc.clone(), emit.clone(), seed,
                                              offset, programs=s) for s in (1, 2, 7, 126)]
    assert all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_a_device_that_is_not_current():
    q, ids, target = make_inputs(4, 3, 5000, seed=6)
    acc, emit, seed, offset = op_args(4)
    expected = specops.chain_speculative_sampling(q, ids, target, acc.clone(), emit.clone(),
                                                  seed=seed, offset=offset)[0]
    other = torch.device("cuda", 1)
    with torch.cuda.device(0):
        out = specops.chain_speculative_sampling(
            q.to(other), ids.to(other), target.to(other), acc.to(other), emit.to(other),
            seed=seed.to(other), offset=offset.to(other))[0]
        assert torch.cuda.current_device() == 0
    assert out.device == other and torch.equal(out.cpu(), expected.cpu())


def test_streams_and_graph_replays_keep_their_own_scratch():
    """Split requests on two streams at once, and a captured graph replayed on a third while they
    run: each call's tokens are the reference's, so no two share partials or arrival counts."""
    batch, num_draft, vocab = 8, 3, 128256
    inputs = [make_inputs(batch, num_draft, vocab, seed=s) for s in (1, 2, 3)]
    acc, emit, seed, offset = op_args(batch)
    expected = [chain_speculative_sampling_reference(q, ids, target, acc.clone(), emit.clone(),
                                                     seed, offset) for q, ids, target in inputs]

    def call(index):
        q, ids, target = inputs[index]
        return chain_speculative_sampling_triton(q, ids, target, acc.clone(), emit.clone(), seed,
                                                 offset, programs=16)

    warm_up(lambda: call(2))
    graph, graph_out = capture(lambda: call(2))
    streams = [torch.cuda.Stream() for _ in range(3)]
    outs = [[], []]
    torch.cuda.synchronize()
    for _ in range(5):
        for index, stream in enumerate(streams[:2]):
            with torch.cuda.stream(stream):
                outs[index].append(call(index))
        with torch.cuda.stream(streams[2]):
            graph.replay()
    torch.cuda.synchronize()
    for index in (0, 1):
        assert all(torch.equal(out, expected[index]) for out in outs[index])
    assert torch.equal(graph_out, expected[2])


def test_large_index_no_overflow():
    # B * (N + 1) * V > 2**31 elements (bf16: ~4.3 GB): 64-bit offsets are needed.
    batch, num_draft, vocab = 4200, 3, 128256
    if torch.cuda.get_device_properties(0).total_memory < 16 * 2**30:
        pytest.skip("needs 16 GiB")
    target = torch.zeros(batch, num_draft + 1, vocab, dtype=torch.bfloat16, device="cuda")
    assert target.numel() > 2**31
    rows = torch.arange(batch, device="cuda")
    target[rows, 0, (rows * 31) % vocab] = 1.0  # one-hot rows, so the answer is known
    ids = torch.full((batch, num_draft), -1, device="cuda", dtype=torch.int64)
    acc, emit, seed, offset = op_args(batch)
    out = chain_speculative_sampling_triton(None, ids, target, acc, emit, seed, offset)
    assert torch.equal(out[:, 0].long(), (rows * 31) % vocab)


def test_chi_square_gpu():
    batch, vocab = 200_000, 32000
    gen = torch.Generator(device="cuda").manual_seed(3)
    support = torch.tensor([0, 5, 1023, 1024, 9000, 20000, 31000, 31999], device="cuda")
    p = torch.zeros(2, vocab, device="cuda")
    p[:, support] = torch.rand(2, len(support), generator=gen, device="cuda") + 0.1
    p /= p.sum(-1, keepdim=True)
    q = torch.zeros(1, vocab, device="cuda")
    q[0, support] = torch.rand(len(support), generator=gen, device="cuda") + 0.1
    q /= q.sum(-1, keepdim=True)
    ids = torch.multinomial(q[0], batch, replacement=True, generator=gen).reshape(batch, 1)
    acc, emit, _, _ = op_args(batch)
    out = chain_speculative_sampling_triton(
        q[None].expand(batch, 1, vocab), ids, p[None].expand(batch, 2, vocab), acc, emit,
        torch.tensor([42], device="cuda"), torch.tensor([0], device="cuda"))
    for position, rows in ((0, torch.ones(batch, dtype=torch.bool, device="cuda")), (1, emit == 1)):
        counts = torch.bincount(out[rows, position].long(), minlength=vocab)[support].double()
        expected = p[position, support].double() * rows.sum()
        assert counts.sum() == rows.sum()
        assert chi2_pvalue(counts, expected) > 1e-5, (position, counts, expected)


def test_cuda_graph_capture_and_replay():
    batch, num_draft, vocab = 16, 4, 32000
    q, ids, target = make_inputs(batch, num_draft, vocab, dtype=torch.bfloat16)
    acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
    emit = torch.zeros(batch, dtype=torch.int32, device="cuda")
    seed = torch.tensor([11], device="cuda")
    offset = torch.tensor([0], device="cuda")

    def step_unseeded():
        return specops.chain_speculative_sampling(q, ids, target, acc, emit)[0]

    def step_seeded():
        return torch.ops.specops.chain_speculative_sampling(q, ids, target, acc, emit, seed, offset)

    warm_up(step_unseeded, step_seeded)

    # No seed: every replay draws a fresh (seed, offset) on the device.
    graph, out = capture(step_unseeded)
    torch.manual_seed(0)
    first = []
    for _ in range(4):
        graph.replay()
        first.append(out.clone())
    assert len({tuple(o.flatten().tolist()) for o in first}) > 1  # fresh randomness
    torch.manual_seed(0)
    again = []
    for _ in range(4):
        graph.replay()
        again.append(out.clone())
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # reproducible after re-seeding

    # Seed/offset tensors updated in place between replays: the graph follows them.
    graph2, out2 = capture(step_seeded)
    for new_offset in (0, 1, 2):
        offset.fill_(new_offset)
        acc.zero_()
        emit.zero_()
        graph2.replay()
        a_ref = torch.zeros_like(acc)
        e_ref = torch.zeros_like(emit)
        ref = chain_speculative_sampling_reference(q, ids, target, a_ref, e_ref, seed, offset)
        assert torch.equal(out2, ref) and torch.equal(acc, a_ref) and torch.equal(emit, e_ref)


def test_reference_backend_captures_in_cuda_graph(monkeypatch):
    """SPECOPS_BACKEND=torch on CUDA tensors: the reference asks the data nothing on the host (its
    CPU-only shortcuts are off), so it too can be captured; replays equal eager calls."""
    monkeypatch.setenv("SPECOPS_BACKEND", "torch")
    batch, num_draft, vocab = 8, 3, 5000
    q, ids, target = make_inputs(batch, num_draft, vocab)
    target[0, :, 7] = float("nan")  # the sanitising path too
    acc, emit, seed, offset = op_args(batch)

    def step():
        return torch.ops.specops.chain_speculative_sampling(q, ids, target, acc, emit, seed, offset)

    warm_up(step)
    graph, out = capture(step)
    for new_offset in (0, 5):
        offset.fill_(new_offset)
        acc.zero_()
        emit.zero_()
        graph.replay()
        a_ref, e_ref = torch.zeros_like(acc), torch.zeros_like(emit)
        ref = chain_speculative_sampling_reference(q, ids, target, a_ref, e_ref, seed, offset)
        assert torch.equal(out, ref) and torch.equal(acc, a_ref) and torch.equal(emit, e_ref)


def test_reduce_overhead_keeps_its_cuda_graph():
    """docs/recipes.md: counters marked static, so inductor does not skip cudagraphs for the
    mutated inputs; the compiled step replays a graph and keeps the counters right."""
    from torch._dynamo.utils import counters

    batch, num_draft, vocab = 8, 3, 32000
    q, ids, target = make_inputs(batch, num_draft, vocab)
    acc = torch.zeros(batch, dtype=torch.int64, device="cuda")
    emit = torch.zeros(batch, dtype=torch.int64, device="cuda")
    torch._dynamo.mark_static_address(acc)
    torch._dynamo.mark_static_address(emit)
    seeds = torch.arange(batch, device="cuda")
    offsets = torch.zeros(batch, dtype=torch.int64, device="cuda")

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def step(q, ids, target, seeds, offsets):
        return specops.chain_speculative_sampling(q, ids, target, acc, emit, seed=seeds,
                                                  offset=offsets)[0]

    torch._dynamo.reset()
    counters.clear()
    ref_acc, ref_emit = torch.zeros_like(acc), torch.zeros_like(emit)
    for k in range(4):
        offsets.fill_(k)
        out = step(q, ids, target, seeds, offsets).clone()
        ref = chain_speculative_sampling_reference(q, ids, target, ref_acc, ref_emit, seeds, offsets)
        assert torch.equal(out, ref)
    assert torch.equal(acc, ref_acc) and torch.equal(emit, ref_emit)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def test_user_generator_under_manual_capture():
    """A user-created CUDA generator registered with the graph: replays differ, and re-seeding the
    generator reproduces them (docs/recipes.md)."""
    batch, num_draft, vocab = 16, 4, 32000
    q, ids, target = make_inputs(batch, num_draft, vocab)
    acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
    emit = torch.zeros(batch, dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)

    def step():
        return specops.chain_speculative_sampling(q, ids, target, acc, emit, generator=gen)[0]

    warm_up(step)
    graph, out = capture(step, gen)
    runs = []
    for _ in range(2):
        gen.manual_seed(5)
        replays = []
        for _ in range(4):
            graph.replay()
            replays.append(out.clone())
        runs.append(replays)
    assert len({tuple(o.flatten().tolist()) for o in runs[0]}) > 1  # fresh on every replay
    assert all(torch.equal(a, b) for a, b in zip(*runs))  # re-seeding reproduces


def test_seed_of_another_dtype_or_device_under_capture():
    """docs/recipes.md: an int32 CUDA seed is cast by a captured kernel that re-runs on every
    replay (the graph follows its current values); a CPU seed tensor is refused at capture."""
    batch, num_draft, vocab = 8, 3, 5000
    q, ids, target = make_inputs(batch, num_draft, vocab)
    acc = torch.zeros(batch, dtype=torch.int32, device="cuda")
    emit = torch.zeros(batch, dtype=torch.int32, device="cuda")
    seed32 = torch.arange(batch, dtype=torch.int32, device="cuda")
    offset32 = torch.zeros(batch, dtype=torch.int32, device="cuda")

    def step():
        return specops.chain_speculative_sampling(q, ids, target, acc, emit, seed=seed32,
                                                  offset=offset32)[0]

    warm_up(step)
    graph, out = capture(step)
    for k in (1, 2, 3):
        offset32.fill_(k)
        seed32[3] = 100 + k
        graph.replay()
        expected = specops.chain_speculative_sampling(q, ids, target, seed=seed32.long(),
                                                      offset=offset32.long())[0]
        assert torch.equal(out, expected), k

    cpu_seed = torch.tensor([7])
    graph2 = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="cannot be captured in a CUDA graph"):
        with torch.cuda.graph(graph2):
            specops.chain_speculative_sampling(q, ids, target, acc, emit, seed=cpu_seed)
