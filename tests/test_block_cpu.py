"""Block verification's CPU backend against the plain reference: the same candidate rows, chunk
masses, stop probabilities and tokens, on clean and dirty inputs."""

from __future__ import annotations

import pytest
import torch

from specops.chain.block import cpu, reference
from specops.core.sampling.probs import sanitize
from specops.core.sampling.race import chunk_masses, chunk_values, num_chunks

NAN, INF = float("nan"), float("inf")
# Every kind of value that sanitize counts as 0, and -0.0 (kept as -0.0 by no clean path).
BAD = [NAN, INF, -INF, -0.5, -0.0, 2.0**118, 2.0**117]
DIRT = ["clean", "target_bad", "draft_bad", "zero_rows", "no_residual", "identical", "ids_end"]


def make_inputs(batch, num_draft, vocab, dirt, seed=0):
    """(draft, ids, target) float32: peaked rows (so that drafts are often kept, and every tau
    occurs), drafts drawn from the draft rows, then ``dirt`` applied."""
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(batch, num_draft + 1, vocab, generator=g) ** 6
    target /= target.sum(-1, keepdim=True)
    draft = torch.rand(batch, num_draft, vocab, generator=g) ** 6
    draft = 0.4 * draft / draft.sum(-1, keepdim=True) + 0.6 * target[:, :num_draft]
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, num_draft)
    rows = torch.arange(batch)
    if dirt in ("target_bad", "draft_bad"):  # bad values in every row, drafted tokens included
        probs = target if dirt == "target_bad" else draft
        for k, bad in enumerate(BAD):
            position = (rows + k) % probs.shape[1]
            at = ids[rows, position.clamp(max=num_draft - 1)] if k % 2 else (rows * 31 + k) % vocab
            probs[rows[k % 3 :: 3], position[k % 3 :: 3], at[k % 3 :: 3]] = bad
    elif dirt == "zero_rows":  # all-zero target and draft rows
        target[::3, 1] = 0.0
        target[1::4, 0] = 0.0
        draft[::2, 0] = 0.0
        target[2::5, num_draft] = 0.0
    elif dirt == "no_residual":  # q >= p everywhere: the residual has no mass
        draft[::2] = target[::2, :num_draft] + 0.25
    elif dirt == "identical":  # h_t = 1: residuals without mass, then the fallback to p_tau
        draft = target[:, :num_draft].clone()
    elif dirt == "ids_end":  # -1 padding and ids >= V end the draft, at every position
        length = rows % (num_draft + 1)  # the valid ids after the first invalid one do not count
        ids = torch.where(torch.arange(num_draft) == length[:, None], -1, ids)
        ids[1::5, -1] = vocab + 3
        ids[2::7, 0] = vocab
    return draft, ids, target


def layout(probs, how):
    """The same values in another memory layout."""
    if how == "expanded":  # request 0's rows for every request (stride 0 over the batch)
        return probs[:1].expand_as(probs)
    if how == "strided":  # every other value of a wider tensor, rows apart
        wide = torch.zeros(probs.shape[0], probs.shape[1], 2 * probs.shape[2], dtype=probs.dtype)
        wide[..., ::2] = probs
        return wide[..., ::2]
    if how == "transposed":  # positions outermost in memory
        return probs.transpose(0, 1).contiguous().transpose(0, 1)
    return probs


def run_both(draft, ids, target, seed, offset, counter_dtype=torch.int64):
    results = []
    for fn in (reference.block_speculative_sampling_reference, cpu.block_speculative_sampling_cpu):
        acc = torch.full((ids.shape[0],), 3, dtype=counter_dtype)
        emit = torch.full((ids.shape[0],), 5, dtype=counter_dtype)
        results.append((fn(draft, ids, target, acc, emit, seed, offset), acc, emit))
    (want, *want_counters), (got, *got_counters) = results
    assert torch.equal(want, got), (want, got)
    assert all(torch.equal(w, g) for w, g in zip(want_counters, got_counters))
    return want


@pytest.mark.parametrize("dirt", DIRT)
@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tokens_equal_the_reference(dirt, with_draft, dtype):
    batch, num_draft, vocab = 40, 3, 2500
    draft, ids, target = make_inputs(batch, num_draft, vocab, dirt, seed=len(dirt))
    target, draft = target.to(dtype), draft.to(dtype) if with_draft else None
    seed, offset = torch.tensor([11]), torch.tensor([4])
    output = run_both(draft, ids, target, seed, offset)
    if dirt == "clean" and with_draft:  # the inputs reach every tau
        kept = (output >= 0).sum(dim=1) - 1
        assert set(kept.tolist()) == set(range(num_draft + 1))


@pytest.mark.parametrize("how", ["expanded", "strided", "transposed"])
@pytest.mark.parametrize("dirt", ["clean", "target_bad", "draft_bad", "ids_end"])
@pytest.mark.parametrize("with_draft", [True, False])
def test_tokens_equal_the_reference_in_every_layout(how, dirt, with_draft):
    draft, ids, target = make_inputs(24, 4, 1500, dirt, seed=3)
    draft = layout(draft, how) if with_draft else None
    run_both(draft, ids, layout(target, how), torch.tensor([2]), torch.tensor([9]))


@pytest.mark.parametrize("batch,num_draft,vocab", [(0, 2, 300), (1, 1, 1), (7, 1, 5), (9, 2, 700),
                                                   (6, 5, 2048), (5, 3, 3 * 1024 + 1), (1, 0, 16),
                                                   (3, 0, 300)])
@pytest.mark.parametrize("with_draft", [True, False])
def test_tokens_equal_the_reference_in_every_shape(batch, num_draft, vocab, with_draft):
    draft, ids, target = make_inputs(batch, num_draft, vocab, "clean", seed=vocab)
    draft = draft if with_draft else None
    for per_request in (False, True):
        seed = torch.arange(batch) * 7 + 1 if per_request else torch.tensor([-(2**62)])
        offset = torch.arange(batch) if per_request else torch.tensor([2**40])
        run_both(draft, ids, target, seed, offset)


@pytest.mark.parametrize("vocab", [16, 2500])
@pytest.mark.parametrize("dirt", DIRT)
@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_request_gives_the_reference_tokens(vocab, dirt, with_draft, dtype):
    """A single request is decided on the host (cpu.one_request): every request of a dirty batch,
    alone, in a strided layout too, must get the reference's tokens and counters."""
    draft, ids, target = make_inputs(12, 4, vocab, dirt, seed=vocab + len(dirt))
    target, draft = target.to(dtype), draft.to(dtype)
    for b in range(ids.shape[0]):
        for how in ("contiguous", "strided"):
            one_draft = layout(draft[b : b + 1], how) if with_draft else None
            run_both(one_draft, ids[b : b + 1], layout(target[b : b + 1], how),
                     torch.tensor([b * 5 + 1]), torch.tensor([b]))


@pytest.mark.parametrize("ids_dtype,counter_dtype", [(torch.int32, torch.int32),
                                                     (torch.int64, torch.int32),
                                                     (torch.int32, torch.int64)])
def test_tokens_equal_the_reference_for_every_index_dtype(ids_dtype, counter_dtype):
    draft, ids, target = make_inputs(16, 3, 1100, "ids_end", seed=5)
    run_both(draft, ids.to(ids_dtype), target, torch.tensor([1]), torch.tensor([0]), counter_dtype)


def test_the_op_on_cpu_tensors_runs_the_cpu_backend(monkeypatch):
    calls = []
    candidate_row = cpu.candidate_row
    monkeypatch.setattr(cpu, "candidate_row", lambda *args: calls.append(1) or candidate_row(*args))
    draft, ids, target = make_inputs(8, 3, 1200, "draft_bad", seed=8)
    acc, emit = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    out = torch.ops.specops.chain_block_speculative_sampling(draft, ids, target, acc, emit,
                                                             torch.tensor([3]), torch.tensor([1]))
    assert calls
    assert torch.equal(out, run_both(draft, ids, target, torch.tensor([3]), torch.tensor([1])))


@pytest.mark.parametrize("dirt", DIRT)
@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("dtype,how", [(torch.float32, "contiguous"), (torch.bfloat16, "strided"),
                                       (torch.float16, "expanded")])
def test_rows_masses_and_stop_probabilities_equal_the_reference(dirt, with_draft, dtype, how):
    """The backend's steps one by one: each position's candidate rows and chunk masses, the stop
    probabilities from them, and the values of the chunk it samples, for every request, every
    position and every chunk, against the reference's (B, N + 1, V) rows."""
    batch, num_draft, vocab = 12, 3, 2100
    draft, ids, target = make_inputs(batch, num_draft, vocab, dirt, seed=1)
    target = layout(target.to(dtype), how)
    draft = layout(draft.to(dtype), how) if with_draft else None
    drafts = reference.read_drafts(draft, ids, target, torch.tensor([6]), torch.tensor([0]))
    rows = reference.candidate_rows(draft, target, drafts, drafts.weights)

    masses = torch.zeros(batch, num_draft + 1, num_chunks(vocab))
    out = torch.empty(batch, vocab)
    for t in range(num_draft + 1):
        q = draft[:, t] if draft is not None and t < num_draft else None
        row = cpu.candidate_row(target[:, t], q, drafts.weights[:, t], ~drafts.ended[:, t],
                                drafts.safe_ids[:, min(t, num_draft - 1)], out)
        assert torch.equal(row, rows[:, t]), t
        masses[:, t] = chunk_masses(row)
        assert torch.equal(masses[:, t], chunk_masses(rows[:, t])), t
    h = reference.stop_probabilities_of_masses(masses, drafts)
    assert torch.equal(h, reference.stop_probabilities(rows, drafts))

    request = torch.arange(batch)
    for tau in range(num_draft + 1):
        tau = torch.full((batch,), tau)
        has_mass = chunk_masses(rows[request, tau]).sum(dim=1) > 0
        sampled = torch.where(has_mass[:, None], rows[request, tau], sanitize(target[request, tau]))
        for chunk in range(masses.shape[2]):
            chunk = torch.full((batch,), chunk)
            values = cpu.sampled_chunk(draft, target, drafts, tau, chunk, has_mass)
            assert torch.equal(values, chunk_values(sampled, chunk))


def test_is_clean_finds_every_value_sanitize_changes():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        rows = torch.rand(3, 50).to(dtype)
        assert cpu.is_clean(rows) and cpu.is_clean(rows[:, ::2]) and cpu.is_clean(rows[:0])
        for bad in BAD:
            dirty = rows.clone()
            dirty[1, 7] = bad  # (float16 holds 2**117 and more as inf)
            assert not cpu.is_clean(dirty), (dtype, bad)
        largest_clean = torch.tensor(2.0**117, dtype=dtype).view(cpu._BITS[dtype]) - 1
        rows[0, 0] = largest_clean.view(dtype)
        assert cpu.is_clean(rows)


@pytest.mark.parametrize("with_draft", [True, False])
def test_single_request_does_not_follow_the_default_dtype(with_draft):
    """The host path computes in float32 whatever torch's default dtype is, as the reference's
    float32 rows do."""
    draft, ids, target = make_inputs(4, 4, 2500, (), seed=21)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        for b in range(ids.shape[0]):
            run_both(draft[b : b + 1] if with_draft else None, ids[b : b + 1],
                     target[b : b + 1], torch.tensor([b + 3]), torch.tensor([0]))
    finally:
        torch.set_default_dtype(old)
