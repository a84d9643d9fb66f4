"""The fused from-logits Triton path against the reference, token for token (interpreter on CPU):
the row statistics kernel, then the verification kernel reading the logits through them.

Under ``TRITON_INTERPRET=1`` the statistics kernel's bisections run in Python, one pass over the
row per step, so rows stay short (V of a few hundred) where top-k or top-p is on.
"""

from __future__ import annotations

import pytest
import torch
from inputs import DEVICE, seeds  # tests/inputs.py; on CPU, conftest.py sets TRITON_INTERPRET=1

from specops.chain.block.launch import block_speculative_sampling_from_logits_triton
from specops.chain.block.reference import block_speculative_sampling_from_logits_reference
from specops.chain.token.launch import chain_speculative_sampling_from_logits_triton
from specops.chain.token.reference import chain_speculative_sampling_from_logits_reference

pytestmark = pytest.mark.interpreter

# verification -> (reference, fused Triton path)
PATHS = {"token": (chain_speculative_sampling_from_logits_reference,
                   chain_speculative_sampling_from_logits_triton),
         "block": (block_speculative_sampling_from_logits_reference,
                   block_speculative_sampling_from_logits_triton)}


def logits_inputs(batch, num_draft, vocab, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    target = (torch.randn(batch, num_draft + 1, vocab, generator=g) * 3).to(dtype)
    draft = (target[:, :num_draft].float() + torch.randn(batch, num_draft, vocab, generator=g))
    ids = torch.randint(0, vocab, (batch, num_draft), generator=g)
    ids[:, -1] = torch.where(torch.arange(batch) % 3 == 0, -1, ids[:, -1])  # some padded drafts
    # A few drafts at the target's argmax, so that greedy rows accept some.
    ids[:, 0] = torch.where(torch.arange(batch) % 2 == 0, target[:, 0].float().argmax(-1), ids[:, 0])
    return target.to(DEVICE), draft.to(dtype).to(DEVICE), ids.to(DEVICE)


def parameters(batch, sampling):
    """Per-request parameters: greedy, plain, and each truncation in turn (as the batch allows)."""
    t = torch.tensor([0.0, 1.0, 0.7, 1.5, 2.0, 0.0][:batch], device=DEVICE)
    k = torch.zeros(batch, dtype=torch.int64, device=DEVICE)
    p = torch.ones(batch, device=DEVICE)
    m = torch.zeros(batch, device=DEVICE)
    if sampling:
        k[2:3] = 5
        p[3:4] = 0.8
        m[4:5] = 0.05
        k[5:], p[5:], m[5:] = 20, 0.9, 0.01
    return t, k, p, m


def run_both(draft_mode, target, draft, ids, params, seed, offset, verification="token"):
    batch = ids.shape[0]
    results = []
    for fn in PATHS[verification]:
        acc = torch.arange(batch, dtype=torch.int32, device=DEVICE)
        emit = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
        draft_probs = torch.softmax(draft.float(), -1) if draft_mode == "probs" else None
        draft_logits = draft if draft_mode == "logits" else None
        out = fn(draft_probs, ids, target, draft_logits, acc, emit, seed, offset, *params)
        results.append((out, acc, emit))
    return results


SHAPES = [
    (6, 2, 300, torch.float32, True),  # every parameter mix, greedy rows among them
    (6, 2, 257, torch.bfloat16, True),
    (3, 2, 1100, torch.float16, False),  # two chunks: temperature only (and greedy)
]
# Token verification on every shape and source of drafts; block verification (slower under the
# interpreter) on every source of drafts of the first shape and one of each other shape.
CASES = ([("token", mode, *shape) for shape in SHAPES for mode in ("probs", "logits", None)]
         + [("block", mode, *SHAPES[0]) for mode in ("probs", "logits", None)]
         + [("block", "logits", *SHAPES[1]), ("block", None, *SHAPES[2])])


@pytest.mark.parametrize("verification, draft_mode, batch, num_draft, vocab, dtype, sampling",
                         CASES)
def test_fused_logits_path_matches_reference(draft_mode, batch, num_draft, vocab, dtype,
                                             sampling, verification):
    target, draft, ids = logits_inputs(batch, num_draft, vocab, dtype, seed=vocab + batch)
    seed, offset = seeds(batch, True, offset_per_request=True)
    (out_r, acc_r, emit_r), (out_k, acc_k, emit_k) = run_both(
        draft_mode, target, draft, ids, parameters(batch, sampling), seed, offset, verification)
    assert torch.equal(out_k, out_r) and torch.equal(acc_k, acc_r) and torch.equal(emit_k, emit_r)


def test_the_drafts_own_parameters_match_reference(verification="token"):
    """Draft logits processed by the draft's parameters (per request, other than the target's):
    the statistics kernel gives the draft rows their own, token for token the reference's (the
    block launcher shares the backend that hands them over, chain/from_logits_triton.py)."""
    batch = 6
    target, draft, ids = logits_inputs(batch, 2, 130, torch.float32, seed=12)
    seed, offset = seeds(batch, True, offset_per_request=True)
    own = (torch.tensor([0.5, 1.0, 0.8, 2.0, 1.0, 0.3], device=DEVICE),
           torch.tensor([0, 3, 0, 0, 8, 0], device=DEVICE), torch.tensor([1.0, 1.0, 1.0, 0.7, 1.0, 1.0], device=DEVICE),
           torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, 0.05], device=DEVICE))
    target_params = parameters(batch, True)
    (out_r, acc_r, emit_r), (out_k, acc_k, emit_k) = run_both(
        "logits", target, draft, ids, (*target_params, *own), seed, offset, verification)
    assert torch.equal(out_k, out_r) and torch.equal(acc_k, acc_r) and torch.equal(emit_k, emit_r)
    acc_same = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    out_same = PATHS[verification][0](None, ids, target, draft, acc_same, torch.zeros_like(acc_same),
                                      seed, offset, *target_params)
    assert not (torch.equal(out_same, out_r) and torch.equal(acc_same, acc_r))  # they count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_statistics_keep_the_rules_tokens_and_scale(dtype):
    """Each row's statistics against core/logits/rule.py directly: the tokens kept (the unsigned bits
    of m - x below the limit L) are those the rule keeps, and no token of a greedy row or a row
    without mass; r is 1 / W of the rule's kept mass (to float32 rounding), a greedy row's index
    is its argmax, and rows without mass are marked so: a threshold one step off fails it even
    where the tokens sampled with one seed do not change."""
    from specops.core.logits import rule
    from specops.core.logits.launch import row_statistics

    batch, positions, vocab = 6, 2, 300
    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(batch, positions, vocab, generator=g) * 3).round(decimals=1).to(dtype)
    logits[1, 0, 7] = torch.nan  # a NaN logit is never kept
    logits[2, 1] = -torch.inf  # a row without a finite logit has no mass
    # A row whose largest logits are -0 and +0 (both kept, weight 1), beside +inf and -inf
    # (never kept).
    logits[3, 1] = -logits[3, 1].abs() - 0.5
    logits[3, 1, [4, 9, 12, 13]] = torch.tensor([-0.0, 0.0, torch.inf, -torch.inf], dtype=dtype)
    t, k, p, m = parameters(batch, True)
    stats = row_statistics(logits.to(DEVICE), t, k, p, m).cpu()
    mode, peak, coef, limit, scale, index = stats.unbind(-1)
    rows = logits.reshape(-1, vocab).float()
    each = lambda v: v.cpu().repeat_interleave(positions)
    expected = rule.processed_rows(rows, each(t), each(k), each(p), each(m))
    valid, e = rule.weights(rows, each(t))
    sampled = (each(t) > 0) & valid.any(-1)
    bits = (peak[:, None].float() - rows).view(torch.int32).long() & 0xFFFFFFFF  # unsigned
    kept = bits < limit[:, None].long()
    assert torch.equal(kept[sampled], expected[sampled] > 0)
    assert not kept[~sampled].any()
    mass = rule.kept_mass(e, expected > 0)
    # The kernel's float32 chunk sums add in its own order: r agrees to float32 rounding.
    torch.testing.assert_close(scale[sampled], 1.0 / mass[sampled], rtol=1e-6, atol=0)
    greedy = (each(t) == 0) & valid.any(-1)
    assert torch.equal(index[greedy].long(), expected[greedy].argmax(-1))
    assert torch.equal(mode == 0, ~valid.any(-1))


def test_row_statistics_in_transformers_order_keep_the_rules_tokens():
    """min-p after top-k and top-p (``min_p_last``): the statistics keep the rule's tokens in
    that order, and its scale; rows where the orders keep other tokens among them."""
    from specops.core.logits import rule
    from specops.core.logits.launch import row_statistics

    g = torch.Generator().manual_seed(13)
    logits = torch.randn(3, 1, 300, generator=g) * 3
    t, k = torch.tensor([1.0, 0.8, 1.2]), torch.tensor([0, 20, 0])
    p, m = torch.tensor([0.7, 1.0, 0.9]), torch.tensor([0.2, 0.3, 0.05])
    stats = row_statistics(logits.to(DEVICE), *(v.to(DEVICE) for v in (t, k, p, m)),
                           min_p_last=True).cpu()
    mode, peak, coef, limit, scale, index = stats.unbind(-1)
    rows = logits[:, 0]
    expected = rule.processed_rows(rows, t, k, p, m, min_p_last=True)
    bits = (peak[:, None].float() - rows).view(torch.int32).long() & 0xFFFFFFFF
    assert torch.equal(bits < limit[:, None].long(), expected > 0)
    valid, e = rule.weights(rows, t)
    torch.testing.assert_close(scale, 1.0 / rule.kept_mass(e, expected > 0), rtol=1e-6, atol=0)
    assert not torch.equal(expected > 0, rule.processed_rows(rows, t, k, p, m) > 0)


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("draft_mode", ["probs", "logits", None])
def test_no_drafts_match_reference(verification, draft_mode):
    """N = 0 from logits (every parameter mix, greedy rows among them): the kernels draw the
    single row's token as the reference does, and leave the counters as they are."""
    g = torch.Generator().manual_seed(4)
    target = (torch.randn(6, 1, 300, generator=g) * 3).to(DEVICE)
    draft = torch.randn(6, 0, 300, generator=g).to(DEVICE)
    ids = torch.empty(6, 0, dtype=torch.int64, device=DEVICE)
    seed, offset = seeds(6, True)
    (out_r, acc_r, emit_r), (out_k, acc_k, emit_k) = run_both(
        draft_mode, target, draft, ids, parameters(6, True), seed, offset, verification)
    assert out_k.shape == (6, 1) and (out_k >= 0).all()
    assert torch.equal(out_k, out_r) and torch.equal(acc_k, acc_r) and torch.equal(emit_k, emit_r)


def test_a_logit_whose_distance_below_the_largest_passes_float32s_range_is_never_kept():
    """At T = +inf (c = 0) a finite logit with x - m rounding to -inf would weigh NaN: the
    statistics never keep it (m - x is +inf, at the keep limit), as the rule counts it invalid,
    and keep every other token, in both orders and with top-k ranking among them."""
    from specops.core.logits import rule
    from specops.core.logits.launch import row_statistics

    logits = torch.randn(4, 1, 40, generator=torch.Generator().manual_seed(5))
    logits[:, 0, 0], logits[:, 0, 1] = 3e38, -3e38
    t = torch.full((4,), torch.inf)
    k, p, m = torch.tensor([0, 1, 5, 0]), torch.tensor([1.0, 1.0, 0.9, 1.0]), torch.zeros(4)
    rows = logits[:, 0]
    for last in (False, True):
        stats = row_statistics(logits.to(DEVICE), *(v.to(DEVICE) for v in (t, k, p, m)),
                               min_p_last=last).cpu()
        mode, peak, coef, limit, scale, index = stats.unbind(-1)
        expected = rule.processed_rows(rows, t, k, p, m, min_p_last=last)
        assert expected[:, 1].eq(0).all() and expected.sum(-1).gt(0.99).all()
        bits = (peak[:, None].float() - rows).view(torch.int32).long() & 0xFFFFFFFF
        assert torch.equal(bits < limit[:, None].long(), expected > 0)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_parameters_are_read_as_float32_and_tiny_temperatures_stay_numbers(verification):
    """Float64 parameters are read as the kernel reads them, as float32: a temperature that
    rounds to 0 is greedy, a top-p or min-p that rounds into its range is that value. A
    temperature so small that log2(e) / T passes float32's range (below about 4.2e-39) gives the
    largest c: every request still gets a token, and both paths the same ones."""
    batch = 5
    target, draft, ids = logits_inputs(batch, 2, 130, torch.float32, seed=21)
    seed, offset = seeds(batch, True, offset_per_request=True)
    f64 = dict(dtype=torch.float64, device=DEVICE)
    params = (torch.tensor([1e-50, 1e-40, 1e-45, 0.7, 1.0], **f64),
              torch.zeros(batch, dtype=torch.int64, device=DEVICE),
              torch.tensor([1.0, 1.0, 0.9, 1 + 1e-12, 1e-50 + 0.9], **f64),
              torch.tensor([0.0, 0.0, 0.0, 1e-50, 1 + 1e-12], **f64))
    (out_r, acc_r, emit_r), (out_k, acc_k, emit_k) = run_both(
        None, target, draft, ids, params, seed, offset, verification)
    assert torch.equal(out_k, out_r) and torch.equal(acc_k, acc_r) and torch.equal(emit_k, emit_r)
    emitted = out_r.gather(1, emit_r.long()[:, None])[:, 0]
    assert bool((emitted >= 0).all()), out_r
