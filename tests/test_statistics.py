"""Distribution tests: the op is lossless (every emitted token follows the target model).

All tests use fixed seeds, so they are deterministic: a pass is a pass on every run.  The p-value
threshold (1e-4) is loose enough for any correct implementation and, at these sample sizes, tight
enough to catch a few-percent bias; ``test_detector_catches_10_percent_acceptance_bias`` shows that
the same checks fail on a deliberately biased sampler.  No scipy: the chi-square p-value is the
regularized upper incomplete gamma function Q(dof/2, x/2) = torch.special.gammaincc.
"""

from __future__ import annotations

import math

import pytest
import torch

import specops
import specops.chain.token.reference
from specops.core.sampling import slots
from specops.demo.stats import chi2_pvalue, normal_pvalue

P_THRESHOLD = 1e-4


def test_chi2_helper_sanity():
    # Exact fit -> p = 1; a grossly wrong fit -> p ~ 0; an impossible count -> 0.
    probs = torch.tensor([0.25, 0.25, 0.5])
    assert chi2_pvalue(torch.tensor([250, 250, 500]), probs) == pytest.approx(1.0)
    assert chi2_pvalue(torch.tensor([400, 100, 500]), probs) < 1e-10
    assert chi2_pvalue(torch.tensor([1, 0]), torch.tensor([0.0, 1.0])) == 0.0
    # With 1 dof chi2 = z**2, so p = erfc(|z| / sqrt(2)).
    p64 = torch.tensor([0.6, 0.4], dtype=torch.float64)
    z = math.sqrt((5980 - 6000) ** 2 / 6000 + 20**2 / 4000)
    assert chi2_pvalue(torch.tensor([5980, 4020]), p64) == pytest.approx(math.erfc(z / math.sqrt(2)))
    # Textbook critical value: chi2 = 23.2093 with 10 dof has p = 0.01 (11 equal categories).
    counts = torch.full((11,), 1000.0)
    counts[0] += math.sqrt(23.2093 * 1000 / 1.1)  # chi2 = x^2/1000 * (1 + 1/10)
    counts[1:] -= (counts[0] - 1000) / 10
    assert chi2_pvalue(counts, torch.full((11,), 1 / 11, dtype=torch.float64)) == pytest.approx(0.01, rel=1e-3)


def acceptance_rates(p: torch.Tensor, q: torch.Tensor | None, d: torch.Tensor | None = None):
    """Per-position acceptance probability: sum(min(p, q)) for drafts drawn from q (semantics step 3),
    or p_j[d_j] for fixed one-hot drafts (draft_probs=None)."""
    if q is not None:
        return torch.minimum(p[: q.shape[0]], q).double().sum(-1)
    return p[torch.arange(d.shape[0]), d].double()


def emitted_distribution(a: torch.Tensor) -> torch.Tensor:
    """P(e = k), k = 0..N, for independent per-position acceptance probabilities a."""
    n = a.numel()
    out = torch.zeros(n + 1, dtype=torch.float64)
    prefix = 1.0
    for k in range(n):
        out[k] = prefix * (1 - a[k])
        prefix = prefix * a[k]
    out[n] = prefix
    return out


def accepted_distribution(a: torch.Tensor) -> torch.Tensor:
    """Poisson-binomial P(#accepted = k): positions are judged independently (semantics step 6)."""
    dist = torch.zeros(a.numel() + 1, dtype=torch.float64)
    dist[0] = 1.0
    for ak in a.tolist():
        dist = torch.cat([dist[:1] * (1 - ak), dist[1:] * (1 - ak) + dist[:-1] * ak])
    return dist


# ----------------------------------------------------------------------------------------------
# The lossless check, shared by the real tests and the bias demonstration


def _distributions(num_draft: int, vocab: int, seed: int):
    """Target rows (N+1, V) and draft rows (N, V): different enough that acceptance is ~60-80%."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(1.5 * torch.randn(num_draft + 1, vocab, generator=g), -1)
    q = torch.softmax(1.5 * torch.randn(num_draft, vocab, generator=g), -1)
    q = 0.5 * q + 0.5 * p[:num_draft]  # some overlap, so later positions are reached often
    return p, q


def lossless_pvalues(batch=20000, num_draft=3, vocab=6, one_hot=False, seed=0) -> dict:
    """Run one call of ``batch`` requests and return the p-values of every check."""
    p, q = _distributions(num_draft, vocab, seed)
    g = torch.Generator().manual_seed(seed + 1)
    if one_hot:
        # Greedy drafts: any fixed draft works; take them from an unrelated distribution.
        d = torch.randint(0, vocab, (batch, num_draft), generator=g)
        draft_probs = None
    else:
        d = torch.multinomial(q, batch, replacement=True, generator=g).T.contiguous()
        draft_probs = q.expand(batch, num_draft, vocab)
    out, accepted, emitted = specops.chain_speculative_sampling(
        draft_probs, d, p.expand(batch, num_draft + 1, vocab), seed=seed + 2, offset=0
    )
    e = emitted.long()
    result = {}
    # Lossless: output[:, j] among requests whose first j drafts were accepted follows p_j.
    for j in range(num_draft + 1):
        tokens = out[e >= j, j].long()
        assert bool((tokens >= 0).all())
        counts = torch.bincount(tokens, minlength=vocab)
        result[f"token[{j}]"] = chi2_pvalue(counts, p[j])
    # Counts: acceptance probability per position is sum(min(p, q)) (or p_j[d_j] for one-hot).
    if one_hot:
        # Per-request rates differ: test the mean only (sum of per-request expectations).
        a = p[:num_draft].gather(1, d.T).T.double()  # (B, N)
        mean_acc = a.sum(1).mean().item()
        var_acc = (a * (1 - a)).sum(1).mean().item()
        result["accepted mean"] = normal_pvalue(accepted.double().mean().item(), mean_acc, var_acc, batch)
        prefix = torch.cumprod(a, 1)
        mean_emit = prefix.sum(1)
        # E[e^2] = sum_k (2k - 1) P(e >= k)
        ks = torch.arange(1, num_draft + 1, dtype=torch.float64)
        var_emit = ((2 * ks - 1) * prefix).sum(1) - mean_emit**2
        result["emitted mean"] = normal_pvalue(
            e.double().mean().item(), mean_emit.mean().item(), var_emit.mean().item(), batch
        )
    else:
        a = acceptance_rates(p, q)
        acc_dist = accepted_distribution(a)
        emit_dist = emitted_distribution(a)
        ks = torch.arange(num_draft + 1, dtype=torch.float64)
        result["accepted hist"] = chi2_pvalue(torch.bincount(accepted.long(), minlength=num_draft + 1), acc_dist)
        result["emitted hist"] = chi2_pvalue(torch.bincount(e, minlength=num_draft + 1), emit_dist)
        mean_a = float((ks * acc_dist).sum())
        var_a = float((ks**2 * acc_dist).sum()) - mean_a**2
        mean_e = float((ks * emit_dist).sum())
        var_e = float((ks**2 * emit_dist).sum()) - mean_e**2
        assert mean_a == pytest.approx(float(a.sum()))  # E[accepted] = sum_j sum_v min(p_j, q_j)
        result["accepted mean"] = normal_pvalue(accepted.double().mean().item(), mean_a, var_a, batch)
        result["emitted mean"] = normal_pvalue(e.double().mean().item(), mean_e, var_e, batch)
    return result


@pytest.mark.parametrize("seed", [0, 1])
def test_lossless_with_drafts_from_q(seed):
    pvalues = lossless_pvalues(seed=seed)
    assert min(pvalues.values()) > P_THRESHOLD, pvalues


def test_lossless_one_hot_drafts():
    pvalues = lossless_pvalues(one_hot=True, seed=3, vocab=7)
    assert min(pvalues.values()) > P_THRESHOLD, pvalues


def test_lossless_per_request_seeds_and_mixed_rows():
    # Different (p, q) pairs in one call, one seed per request: group the requests by the pair
    # they use and test each group on its own.
    batch, num_draft, vocab, groups = 16000, 2, 5, 4
    dists = [_distributions(num_draft, vocab, 10 + k) for k in range(groups)]
    which = torch.arange(batch) % groups
    p = torch.stack([dists[k][0] for k in range(groups)])[which]
    q = torch.stack([dists[k][1] for k in range(groups)])[which]
    g = torch.Generator().manual_seed(5)
    d = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, num_draft)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g)
    out, _, emitted = specops.chain_speculative_sampling(q, d, p, seed=seeds, offset=0)
    pvalues = []
    for k in range(groups):
        for j in range(num_draft + 1):
            mask = (which == k) & (emitted >= j)
            counts = torch.bincount(out[mask, j].long(), minlength=vocab)
            pvalues.append(chi2_pvalue(counts, dists[k][0][j]))
    # 12 tests: Bonferroni-style threshold keeps the family-wise level near P_THRESHOLD.
    assert min(pvalues) > P_THRESHOLD / len(pvalues), pvalues


# ----------------------------------------------------------------------------------------------
# Large vocabulary: the exponential race over CHUNK_SIZE-token chunks and the in-chunk inverse CDF

LARGE_V = 50 * 1024 + 300  # >= 50000, with a partial last chunk
SPIKES = [3, 1500, 9000, 20000, 33333, 47000, LARGE_V - 1]  # far apart: many different chunks
DIFFUSE = (30 * 1024 + 100, 30 * 1024 + 900)  # mass spread inside one chunk: 4 bins of 200
DRAFT = 20000


def _large_vocab_rows():
    p = torch.zeros(LARGE_V, dtype=torch.float64)
    p[SPIKES] = torch.tensor([0.05, 0.20, 0.10, 0.05, 0.15, 0.05, 0.10], dtype=torch.float64)
    lo, hi = DIFFUSE
    p[lo:hi] = torch.linspace(1.0, 3.0, hi - lo, dtype=torch.float64)
    p[lo:hi] *= 0.30 / p[lo:hi].sum()
    q = torch.zeros(LARGE_V, dtype=torch.float64)
    q[DRAFT] = 0.50  # p(d)/q(d) = 0.1: ~90% of the drafts are rejected
    q[9000] = 0.10  # q == p: residual 0, must never be emitted after a rejection
    q[47000] = 0.20  # q > p: residual 0 as well
    q[1500] = 0.05  # q < p: residual 0.15
    q[lo:hi] = 0.15 / (hi - lo)  # flat: residual keeps a changing shape inside the chunk
    q /= q.sum()
    return p.float(), q.float()


def _binned(tokens: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of ``tokens`` and probabilities from ``weights`` over categories: each spike, four
    bins of the diffuse chunk, and 'anything else' (probability 0)."""
    lo, hi = DIFFUSE
    edges = torch.linspace(lo, hi, 5).long().tolist()
    counts, probs = [], []
    covered = torch.zeros(LARGE_V, dtype=torch.bool)
    for t in SPIKES:
        counts.append((tokens == t).sum())
        probs.append(weights[t].double())
        covered[t] = True
    for a, b in zip(edges[:-1], edges[1:]):
        counts.append(((tokens >= a) & (tokens < b)).sum())
        probs.append(weights[a:b].double().sum())
        covered[a:b] = True
    counts.append((~covered[tokens.clamp(0, LARGE_V - 1)] | (tokens < 0)).sum())
    probs.append(weights[~covered].double().sum())
    return torch.stack(counts), torch.stack(probs)


def test_large_vocab_residual_and_bonus():
    p, q = _large_vocab_rows()
    residual = (p - q).clamp_min(0)
    batch, calls = 1000, 8  # memory: the reference materialises a few (batch, V) rows
    p_rows = torch.stack([p, p]).expand(batch, 2, LARGE_V)  # batch-shared rows: views, no copies
    q_rows = q.expand(batch, 1, LARGE_V)
    d = torch.full((batch, 1), DRAFT, dtype=torch.int64)
    rejected_tokens, bonus_tokens = [], []
    for call in range(calls):
        out, accepted, emitted = specops.chain_speculative_sampling(
            q_rows, d, p_rows, seed=1234, offset=call
        )
        rejected_tokens.append(out[emitted == 0, 0])
        bonus_tokens.append(out[emitted == 1, 1])
    rejected_tokens = torch.cat(rejected_tokens).long()
    bonus_tokens = torch.cat(bonus_tokens).long()
    n = batch * calls
    # The draft is accepted with probability p(d)/q(d) = 0.1.
    assert normal_pvalue(len(bonus_tokens) / n, 0.1, 0.09, n) > P_THRESHOLD
    # Rejected: relu(p - q), normalised; tokens 9000 and 47000 (residual 0) are impossible.
    counts, probs = _binned(rejected_tokens, residual)
    assert probs[SPIKES.index(9000)] == 0 and probs[SPIKES.index(47000)] == 0
    assert chi2_pvalue(counts, probs) > P_THRESHOLD, (counts, probs)
    # The bonus token (position N) follows p_N.
    counts, probs = _binned(bonus_tokens, p)
    assert chi2_pvalue(counts, probs) > P_THRESHOLD, (counts, probs)


def test_large_vocab_one_hot_drafts():
    # draft_probs=None: a rejected draft is removed from p and the rest renormalised.
    p, _ = _large_vocab_rows()
    batch, calls = 1000, 3
    d = torch.full((batch, 1), 33333, dtype=torch.int64)  # p(d) = 0.15: mostly rejected
    tokens = []
    for call in range(calls):
        out, _, emitted = specops.chain_speculative_sampling(
            None, d, p.expand(batch, 2, LARGE_V), seed=99, offset=call
        )
        tokens.append(out[emitted == 0, 0])
    tokens = torch.cat(tokens).long()
    residual = p.clone()
    residual[33333] = 0
    counts, probs = _binned(tokens, residual)
    assert counts[SPIKES.index(33333)] == 0
    assert chi2_pvalue(counts, probs) > P_THRESHOLD, (counts, probs)


# ----------------------------------------------------------------------------------------------
# The detector detects: a sampler whose acceptance is biased by ~10% fails the same checks


def test_detector_catches_10_percent_acceptance_bias(monkeypatch):
    num_draft = 3

    def biased(real):
        def biased_uniforms(seed, offset, batch_size, num_slots):
            u = real(seed, offset, batch_size, num_slots).clone()
            coins = slots.coin_slots(6, num_draft)  # lossless_pvalues' V = 6
            u[:, coins] *= 0.9  # acceptance coins: P(accept) = min(1, p / (0.9 q))
            return u

        return biased_uniforms

    # The reference and the CPU backend look their functions up at call time, so patching their
    # module globals works.
    for module, name in ((specops.chain.token.reference, "request_uniforms"),
                         (specops.chain.token.cpu, "request_uniforms_fast")):
        monkeypatch.setattr(module, name, biased(getattr(module, name)))
    biased = lossless_pvalues(seed=0, num_draft=num_draft)
    monkeypatch.undo()
    honest = lossless_pvalues(seed=0, num_draft=num_draft)
    assert min(honest.values()) > P_THRESHOLD, honest
    # Same inputs, same seed: the only difference is the bias, and the checks flag it.
    assert biased["token[0]"] < 1e-6, biased
    assert biased["accepted mean"] < 1e-6, biased
    assert biased["emitted mean"] < 1e-6, biased
