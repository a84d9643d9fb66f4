"""The CPU backend against the plain reference: the same rows, masses and tokens."""

from __future__ import annotations

import pytest
import torch

from specops.chain.token import cpu, reference
from specops.core.sampling import randomness, slots
from specops.core.sampling.race import chunk_masses


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


def single_request(g, num_draft, vocab, dtype, dirt):
    """One request's rows: peaked rows (many chunks without mass), drafts mostly from the draft
    row, some invalid ids, and values that count as 0 mixed in."""
    target = torch.rand(1, num_draft + 1, vocab, generator=g) ** 8
    draft = torch.rand(1, num_draft, vocab, generator=g) ** 8
    target[:, :, : vocab // 3] = 0.0  # chunks without mass, and residuals that may have none
    ids = torch.multinomial(draft[0] + 1e-9, 1, generator=g).T.clone()
    if dirt == "ids":
        ids[0, torch.randint(0, num_draft, (1,), generator=g)] = int(
            torch.tensor([-1, vocab, -7, vocab + 5])[torch.randint(0, 4, (1,), generator=g)])
    elif dirt == "target":
        target[0, :, ::97] = torch.tensor([float("nan"), -1.0, -float("inf"), float("inf")])[
            torch.randint(0, 4, (1,), generator=g)]
    elif dirt == "draft":
        draft[0, :, ::89] = torch.tensor([float("nan"), -0.5, float("inf"), 2.0**117])[
            torch.randint(0, 4, (1,), generator=g)]
    elif dirt == "no_residual_mass":
        draft[0] = target[0, :num_draft] + 0.5
    return draft.to(dtype), ids, target.to(dtype)


@pytest.mark.parametrize("with_draft", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [700, 2048, 3000])
@pytest.mark.parametrize("dirt", ["clean", "ids", "target", "draft", "no_residual_mass"])
def test_single_request_gives_the_reference_tokens(with_draft, dtype, vocab, dirt):
    """B = 1 runs on the request's scalars (``one_request``); it must give the reference's tokens
    and counters, and hand over to the batch path only when its row needs the plain step 5."""
    g = torch.Generator().manual_seed(vocab + len(dirt))
    for call in range(12):
        num_draft = 1 + call % 4
        draft, ids, target = single_request(g, num_draft, vocab, dtype, dirt)
        draft = draft if with_draft else None
        seed, offset = torch.randint(-(2**63), 2**63 - 1, (2,), generator=g).tolist()
        counter_dtype = (torch.int32, torch.int64)[call % 2]
        assert_same(run_both(draft, ids, target, seed, offset, counter_dtype))
        if dirt == "clean" or dirt == "ids":  # rows the shortcut takes: no hand-over
            counters = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
            with torch.inference_mode():
                assert cpu.one_request(draft, ids, target, *counters, torch.tensor([seed]),
                                       torch.tensor([offset])) is not None


def test_single_request_acceptance_rounds_as_float32():
    """Position j is accepted when u_j * q_j < p_j in float32. With p_j set to the float32
    product itself (or the float32 values next to it) only a product rounded as float32 rounds
    it decides each position as the reference does."""
    vocab, num_draft = 1500, 4
    g = torch.Generator().manual_seed(5)
    differs_from_exact = 0
    for seed in range(60):
        target = torch.rand(1, num_draft + 1, vocab, generator=g)
        draft = torch.rand(1, num_draft, vocab, generator=g) + 0.01
        ids = torch.randint(0, vocab, (1, num_draft), generator=g)
        u = randomness.request_uniforms(torch.tensor([seed]), torch.tensor([0]), 1,
                                        slots.num_slots(num_draft, vocab))[0]
        coins = u[slots.coin_slots(vocab, num_draft)]
        rows = torch.arange(num_draft)
        q = draft[0, rows, ids[0]]
        product = coins * q  # float32
        step = torch.tensor([-1, 0, 1])[torch.randint(0, 3, (num_draft,), generator=g)]
        target[0, rows, ids[0]] = torch.nextafter(product, product + step)
        exact = coins.double() * q.double()
        differs_from_exact += int((exact < product.double()).sum())
        assert_same(run_both(draft, ids, target, seed, 0))
    assert differs_from_exact > 10  # the rounding decided some of the positions


def test_single_request_with_flushed_denormals():
    """Under torch.set_flush_denormal(True) torch reads float32 denormals as 0 and flushes
    results to 0; the host arithmetic of one_request sees the same, since every float32 value
    reaches it through a conversion, and its float32 rounding flushes too."""
    vocab, num_draft = 1100, 3
    g = torch.Generator().manual_seed(9)
    target = torch.rand(1, num_draft + 1, vocab, generator=g) * 2.0**-130  # denormal
    target[:, :, ::3] = torch.rand(1, num_draft + 1, 367, generator=g)
    draft = torch.rand(1, num_draft, vocab, generator=g) * 2.0**-130
    ids = torch.arange(1, 3 * num_draft + 1, 3).view(1, -1)  # drafts where both are denormal
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        for seed in range(40):
            assert_same(run_both(draft, ids, target, seed, 0))
            assert_same(run_both(draft.expand(4, -1, -1), ids.expand(4, -1),
                                 target.expand(4, -1, -1), seed, 0))
    finally:
        torch.set_flush_denormal(False)


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


@pytest.mark.parametrize("batch", [0, 5])
def test_batch_path_per_request_seeds_and_empty_batch(batch):
    g = torch.Generator().manual_seed(2)
    num_draft, vocab = 3, 1500
    target = torch.rand(batch, num_draft + 1, vocab, generator=g) ** 4
    draft = torch.rand(batch, num_draft, vocab, generator=g) ** 4
    ids = torch.randint(-1, vocab, (batch, num_draft), generator=g)
    for _ in range(5):
        seeds = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g).tolist()
        offsets = torch.randint(-(2**63), 2**63 - 1, (batch,), generator=g).tolist()
        assert_same(run_both(draft, ids, target, seeds, offsets))
        assert_same(run_both(None, ids, target, seeds, offsets[:1]))


def test_host_helpers_match_torch():
    """The pieces of one_request that replace torch operations: float32 rounding of a product,
    and the chunk masses of one row."""
    g = torch.Generator().manual_seed(4)
    u = torch.rand(5000, generator=g)
    q = torch.rand(5000, generator=g) * torch.tensor([1.0, 2.0**-120, 2.0**-140, 1e30]).repeat(1250)
    assert [cpu.as_float32(a * b) for a, b in zip(u.tolist(), q.tolist())] == (u * q).tolist()
    for vocab in (5, 1024, 2500, 4096):
        row = torch.rand(1, vocab, generator=g) ** 6
        assert cpu.chunk_mass_list(row[0]) == chunk_masses(row).tolist()[0]
