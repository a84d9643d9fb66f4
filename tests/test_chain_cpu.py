"""The CPU backend against the plain reference: the same rows, masses and tokens."""

from __future__ import annotations

import pytest
import torch

from specops.chain.token import cpu, reference
from specops.core.race import chunk_masses


@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dirt", ["clean", "q_bad", "p_negative", "p_nan", "p_posinf",
                                  "p_huge_over_q", "no_residual_mass"])
@pytest.mark.parametrize("expanded", [False, True])
def test_cpu_shortcut_gives_the_plain_rows(with_draft, dtype, dirt, expanded):
    """The CPU backend forms the sampled rows by a shortcut (the draft row gathered and checked,
    the target row added in place, p_e unchecked) and falls back to the reference's plain step 5
    when a draft row is not clean, a row mass is non-finite or too large, or a residual is empty.
    Where it does not fall back it must give the reference's rows and chunk masses exactly; where
    it must fall back, it does."""

    batch, num_draft, vocab = 12, 3, 2500
    g = torch.Generator().manual_seed(7)
    target = torch.rand(batch, num_draft + 1, vocab, generator=g)
    draft = torch.rand(batch, num_draft, vocab, generator=g)
    e = torch.arange(batch) % (num_draft + 1)  # every position, N (all accepted) included
    e_draft = e.clamp(max=num_draft - 1)
    use_residual = (e < num_draft) & (torch.arange(batch) % 5 != 1)  # some drafts ended at e
    d_e = torch.randint(0, vocab, (batch,), generator=g)
    rows = torch.arange(batch)
    if dirt == "q_bad":  # NaN, infinities and negatives in the draft rows the shortcut reads
        for k, bad in enumerate([float("nan"), float("inf"), -float("inf"), -0.5, -0.0]):
            draft[rows, e_draft, 100 * k + d_e % 50] = bad
    elif dirt == "p_negative":  # the relu alone must sanitise these
        target[rows, e, d_e] = -1.0
        target[rows, e, (d_e + 7) % vocab] = -float("inf")
    elif dirt == "p_nan":  # (row 0, which the expanded layout shares)
        target[0, e[0], 5] = float("nan")
    elif dirt == "p_posinf":
        target[0, e[0], 9] = float("inf")
    elif dirt == "p_huge_over_q":  # p counts as 0; p - q would not show it in the masses
        target[rows, e, d_e] = 2.0**117  # PROBABILITY_BOUND: counts as 0
        draft[rows, e_draft, d_e] = 2.0**116.9  # clean, and close to it
    elif dirt == "no_residual_mass":  # p_e <= q_e everywhere in row 0
        draft[0, e_draft[0]] = target[0, e[0]] + 0.25
    target, draft = target.to(dtype), draft.to(dtype)
    if expanded:  # rows shared across the batch: a layout the sparse row add cannot view
        target, draft = target[:1].expand_as(target), draft[:1].expand_as(draft)
    if not with_draft:
        draft = None

    verdict = reference.Verdict(None, None, e, use_residual, d_e, None)
    plain_rows = reference.sampled_rows(draft, target, verdict)
    plain_masses = chunk_masses(plain_rows)
    shortcut = cpu.sampled_rows_fast(draft, target, verdict)
    must_fall_back = (dirt in ("p_nan", "p_posinf", "p_huge_over_q")
                      or (dirt in ("q_bad", "no_residual_mass") and with_draft))
    if must_fall_back:
        assert shortcut is None
    else:
        assert shortcut is not None
        assert torch.equal(shortcut[0], plain_rows) and torch.equal(shortcut[1], plain_masses)
    assert bool(torch.isfinite(plain_rows).all()) and bool((plain_rows >= 0).all())


@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_backend_gives_the_reference_tokens(with_draft, dtype):
    """Whole calls, with dirty rows and ids that end the draft mixed in: tokens and counters equal."""
    batch, num_draft, vocab = 64, 3, 2100
    g = torch.Generator().manual_seed(11)
    target = torch.rand(batch, num_draft + 1, vocab, generator=g) ** 4
    draft = torch.rand(batch, num_draft, vocab, generator=g) ** 4
    ids = torch.randint(-1, vocab + 2, (batch, num_draft), generator=g)
    target[::7, :, ::13] = float("nan")
    target[1::9, :, ::5] = -1.0
    draft[2::11, :, ::17] = float("inf")
    draft[3::5] = target[3::5, :num_draft] + 0.5  # residuals without mass
    target, draft = target.to(dtype), draft.to(dtype) if with_draft else None
    seed = torch.tensor([5], dtype=torch.int64)
    offset = torch.tensor([2], dtype=torch.int64)
    results = []
    for implementation in (reference.chain_speculative_sampling_reference,
                           cpu.chain_speculative_sampling_cpu):
        counters = [torch.zeros(batch, dtype=torch.int64) for _ in range(2)]
        results.append((implementation(draft, ids, target, *counters, seed, offset), *counters))
    for want, got in zip(*results):
        assert torch.equal(want, got)


def run_both(draft, ids, target, seed, offset, counter_dtype=torch.int64):
    """(output, accepted, emitted) of the reference and of the CPU backend on the same call."""
    results = []
    for implementation in (reference.chain_speculative_sampling_reference,
                           cpu.chain_speculative_sampling_cpu):
        counters = [torch.full((ids.shape[0],), 3, dtype=counter_dtype) for _ in range(2)]
        seed_t = torch.tensor(seed, dtype=torch.int64).reshape(-1)
        offset_t = torch.tensor(offset, dtype=torch.int64).reshape(-1)
        results.append((implementation(draft, ids, target, *counters, seed_t, offset_t), *counters))
    return results


def assert_same(results):
    for want, got in zip(*results):
        assert got.dtype == want.dtype and torch.equal(want, got), (want, got)


@pytest.mark.parametrize("batch", [1, 6])
def test_target_values_too_large_under_large_draft_values(batch):
    """A target value of PROBABILITY_BOUND counts as 0; a clean draft value just below it at the
    same token makes p - q small, so the shortcut must notice it by the draft value's size."""
    vocab, num_draft = 2048, 2
    target = torch.full((batch, num_draft + 1, vocab), 1.0 / vocab)
    draft = torch.full((batch, num_draft, vocab), 1.0 / vocab)
    ids = torch.full((batch, num_draft), 5)
    target[:, 0, 5] = 0.0  # the first draft is rejected
    target[:, 0, 100] = 2.0**117
    draft[:, 0, 100] = 2.0**116.9
    for seed in range(20):
        assert_same(run_both(draft, ids, target, seed, 0))
