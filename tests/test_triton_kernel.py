"""The Triton kernel against the pure-torch reference, token for token (interpreter on CPU).

Under ``TRITON_INTERPRET=1`` every program runs in Python (a few ms per 1024-token chunk), so the
shapes stay small: V up to ~2100 (three chunks) and a handful of requests.
"""

from __future__ import annotations

import math

import pytest
import torch
from inputs import DEVICE, make_inputs, seeds  # tests/inputs.py; on CPU, conftest.py sets TRITON_INTERPRET=1

import specops
from specops.chain.token.launch import chain_speculative_sampling_triton
from specops.chain.token.reference import chain_speculative_sampling_reference
from specops.demo.stats import chi2_pvalue

pytestmark = pytest.mark.interpreter


def run_both(draft_probs, ids, target, seed, offset, *, acc_dtype=torch.int32,
             emit_dtype=torch.int32, programs=None):
    """(reference output, counters), (kernel output, counters) from the same counters' start."""
    batch = ids.shape[0]
    start_acc = torch.arange(batch, dtype=acc_dtype, device=DEVICE) * 3
    start_emit = torch.arange(batch, dtype=emit_dtype, device=DEVICE) + 7
    results = []
    for kernel in (chain_speculative_sampling_reference, chain_speculative_sampling_triton):
        acc, emit = start_acc.clone(), start_emit.clone()
        kwargs = {"programs": programs} if kernel is chain_speculative_sampling_triton else {}
        out = kernel(draft_probs, ids, target, acc, emit, seed, offset, **kwargs)
        results.append((out, acc, emit))
    return results


def assert_same(results):
    (out_r, acc_r, emit_r), (out_k, acc_k, emit_k) = results
    assert out_k.dtype == torch.int32 and out_k.shape == out_r.shape
    torch.testing.assert_close(out_k, out_r, rtol=0, atol=0)
    torch.testing.assert_close(acc_k, acc_r, rtol=0, atol=0)
    torch.testing.assert_close(emit_k, emit_r, rtol=0, atol=0)


@pytest.mark.parametrize(
    "batch, num_draft, vocab, draft, dtype, ids_dtype, per_request",
    [
        (4, 3, 1500, True, torch.float32, torch.int64, False),  # V not a multiple of the chunk
        (3, 2, 2100, True, torch.float32, torch.int32, True),  # three chunks, per-request seeds
        (4, 1, 700, True, torch.float32, torch.int64, False),  # V < one chunk, N = 1
        (1, 4, 1100, False, torch.float32, torch.int64, True),  # B = 1, draft_probs None
        (3, 2, 1500, True, torch.float16, torch.int64, False),
        (3, 2, 1500, True, torch.bfloat16, torch.int32, True),
        (3, 3, 1024, False, torch.bfloat16, torch.int64, False),  # V exactly one chunk
    ],
)
def test_matches_reference(batch, num_draft, vocab, draft, dtype, ids_dtype, per_request):
    draft_probs, ids, target = make_inputs(batch, num_draft, vocab, dtype=dtype, draft=draft,
                                           ids_dtype=ids_dtype, seed=vocab + batch)
    seed, offset = seeds(batch, per_request, offset_per_request=per_request)
    assert_same(run_both(draft_probs, ids, target, seed, offset))


@pytest.mark.parametrize("acc_dtype, emit_dtype", [(torch.int64, torch.int32), (torch.int32, torch.int64)])
def test_counter_dtypes(acc_dtype, emit_dtype):
    draft_probs, ids, target = make_inputs(3, 3, 900, seed=3)
    seed, offset = seeds(3, per_request=False)
    assert_same(run_both(draft_probs, ids, target, seed, offset, acc_dtype=acc_dtype,
                         emit_dtype=emit_dtype))


@pytest.mark.parametrize("draft", [True, False])
def test_output_does_not_depend_on_programs_per_request(draft):
    # 3 chunks: 1, 2 (2 + 1 chunks) and 3 programs per request must give the same tokens.
    draft_probs, ids, target = make_inputs(3, 2, 2100, draft=draft, sharp=1.0, seed=11)
    seed, offset = seeds(3, per_request=True)
    outputs = []
    for programs in (1, 2, 3):
        results = run_both(draft_probs, ids, target, seed, offset, programs=programs)
        assert_same(results)
        outputs.append(results[1][0])
    assert all(torch.equal(o, outputs[0]) for o in outputs)


def test_invalid_ids_and_padding():
    # -1 padding, other negatives and ids >= V end the draft; never an out-of-bounds read.
    draft_probs, ids, target = make_inputs(6, 4, 1100, seed=5)
    ids[0, 0] = -1
    ids[1, 2] = -1
    ids[1, 3] = -1
    ids[2, 1] = 1100  # == V
    ids[3, 0] = 10**6
    ids[4, 3] = -(2**40)
    seed, offset = seeds(6, per_request=False)
    results = run_both(draft_probs, ids, target, seed, offset)
    assert_same(results)
    out = results[1][0]
    assert (out[0] >= -1).all() and (out < 1100).all()
    assert out[0, 1:].eq(-1).all() and out[3, 1:].eq(-1).all()


@pytest.mark.parametrize("draft", [True, False])
def test_nan_negative_and_zero_rows(draft):
    draft_probs, ids, target = make_inputs(7, 2, 1500, draft=draft, seed=7)
    target[0, :, 5::7] = float("nan")  # NaN counts as 0
    target[1] = -target[1]  # every p negative: nothing accepted, no mass: -1
    target[2, 0] = 0.0  # rejected at 0 (p = 0), residual zero, p_0 zero: -1
    target[3, :, 1030:] = float("inf")  # inf counts as 0
    if draft:
        # residual relu(p - q) has no mass but p has: falls back to p.
        draft_probs[4, 0] = target[4, 0]
        draft_probs[5, 1] = float("nan")
    target[4, 0, ids[4, 0]] = 0.0  # force rejection at 0
    if draft:
        draft_probs[4, 0, ids[4, 0]] = 0.5
    target[5, :, 1000:1100] = 3e38  # too large to sum: counts as 0, as +inf does
    target[6] = 3e38  # no mass at all: -1
    seed, offset = seeds(7, per_request=True)
    results = run_both(draft_probs, ids, target, seed, offset)
    assert_same(results)
    out = results[1][0]
    assert out[1, 0] == -1 and out[2, 0] == -1 and out[6, 0] == -1
    assert out[4, 0] >= 0
    assert not ((out[5] >= 1000) & (out[5] < 1100)).any()


def test_non_contiguous_inputs():
    draft_probs, ids, target = make_inputs(4, 3, 1100, seed=9)
    wide_ids = torch.stack([ids, ids], dim=2).reshape(4, 6)
    ids_view = wide_ids[:, ::2]  # stride 2 along N
    target_view = target.transpose(1, 2).contiguous().transpose(1, 2)  # vocabulary stride != 1
    draft_view = torch.stack([draft_probs, draft_probs], dim=1).flatten(0, 1)[::2]  # batch stride doubled
    seed, offset = seeds(4, per_request=True, offset_per_request=True)
    expected = run_both(draft_probs, ids, target, seed, offset)[0]
    acc = torch.zeros(8, dtype=torch.int64, device=DEVICE)[::2]
    emit = torch.zeros(8, dtype=torch.int32, device=DEVICE)[1::2]
    out = chain_speculative_sampling_triton(draft_view, ids_view, target_view, acc, emit, seed, offset)
    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(acc, expected[1].long() - torch.arange(4, device=DEVICE) * 3,
                               rtol=0, atol=0)
    torch.testing.assert_close(emit, expected[2] - torch.arange(4, device=DEVICE, dtype=torch.int32) - 7,
                               rtol=0, atol=0)


def test_op_routes_through_triton(monkeypatch):
    draft_probs, ids, target = make_inputs(3, 2, 1100, seed=13)
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("SPECOPS_BACKEND", backend)
        acc = torch.zeros(3, dtype=torch.int64, device=DEVICE)
        out, acc_out, emit_out = specops.chain_speculative_sampling(
            draft_probs, ids, target, maybe_output_accepted_token_num=acc, seed=2024, offset=5)
        assert acc_out is acc
        outs[backend] = (out, acc, emit_out)
    for a, b in zip(outs["torch"], outs["triton"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_op_triton_backend_is_called(monkeypatch):
    # Guard against the op silently taking the reference path.
    import specops.chain.token.launch as module

    calls = []
    original = module.chain_speculative_sampling_triton

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "chain_speculative_sampling_triton", spy)
    monkeypatch.setenv("SPECOPS_BACKEND", "triton")
    draft_probs, ids, target = make_inputs(2, 1, 600, seed=17)
    specops.chain_speculative_sampling(draft_probs, ids, target, seed=1)
    assert calls


def test_chi_square_distribution():
    """output[0] ~ p_0 and, when the draft is accepted, output[1] ~ p_1 (speculative sampling is
    exact). One request repeated B times via a stride-0 batch; one seed: stream = row."""
    batch, vocab = 600, 1100  # the interpreter runs ~30 ms per request: keep it small
    gen = torch.Generator().manual_seed(99)
    support = torch.tensor([3, 500, 1000, 1023, 1024, 1050, 1099])  # both chunks, and the tail
    p = torch.zeros(2, vocab)
    p[:, support] = torch.rand(2, len(support), generator=gen) + 0.2
    p = p / p.sum(-1, keepdim=True)
    q = torch.zeros(1, vocab)
    q[0, support] = torch.rand(len(support), generator=gen) + 0.2
    q = q / q.sum(-1, keepdim=True)
    draft_id = torch.multinomial(q[0], batch, replacement=True, generator=gen).reshape(batch, 1)
    target = p[None].expand(batch, 2, vocab).to(DEVICE)
    draft_probs = q[None].expand(batch, 1, vocab).to(DEVICE)
    acc = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    emit = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    seed = torch.tensor([31337], device=DEVICE)
    offset = torch.tensor([0], device=DEVICE)
    out = chain_speculative_sampling_triton(draft_probs, draft_id.to(DEVICE), target, acc, emit,
                                            seed, offset).cpu()
    for position, rows in ((0, torch.ones(batch, dtype=torch.bool)), (1, emit.cpu() == 1)):
        tokens = out[rows, position]
        assert (tokens >= 0).all()
        counts = torch.bincount(tokens, minlength=vocab)[support].double()
        assert counts.sum() == rows.sum()
        expected = p[position, support].double() * rows.sum()
        assert chi2_pvalue(counts, expected) > 1e-5, (position, counts, expected)
    # Acceptance rate of position 0 is sum(min(p, q)) (binomial, 5 sigma).
    rate = float(torch.minimum(p[0], q[0]).sum())
    assert abs(float(acc.sum()) - batch * rate) < 5 * math.sqrt(batch * rate * (1 - rate))


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("draft", [True, False])
def test_no_drafts_match_reference(draft, verification):
    """N = 0: one token from the single row (two chunks), the counters as they were, from token
    and block verification's kernels alike."""
    from specops.chain.block.launch import block_speculative_sampling_triton
    from specops.chain.block.reference import block_speculative_sampling_reference

    draft_probs, ids, target = make_inputs(5, 0, 1500, draft=draft, seed=3)
    seed, offset = seeds(5, per_request=True)
    if verification == "token":
        results = run_both(draft_probs, ids, target, seed, offset)
    else:
        results = []
        for fn in (block_speculative_sampling_reference, block_speculative_sampling_triton):
            acc, emit = torch.full((5,), 2, device=DEVICE), torch.full((5,), 3, device=DEVICE)
            results.append((fn(draft_probs, ids, target, acc, emit, seed, offset), acc, emit))
    assert_same(results)
    assert results[1][0].shape == (5, 1) and (results[1][0] >= 0).all()
