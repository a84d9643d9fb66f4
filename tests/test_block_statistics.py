"""Block verification is exact, sequence by sequence, and keeps more drafts than token verification.

Block verification's output is not exact position by position: a draft it keeps may follow the
target only together with the tokens after it. So the test decodes whole sequences by repeated
calls, in small worlds whose target and draft rows depend on the absolute position alone; there
the target's sequences are independent tokens, token t drawn from P_t, and the chi-square test
compares the joint distribution of the first L tokens with that product. A variant that samples
the residual without its weight w_tau must fail the same test (the detector detects). Fixed seeds:
deterministic.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import specops
from specops.chain.block import reference as block
from specops.chain.outputs import write_outputs
from specops.demo.stats import normal_pvalue

import worlds  # tests/worlds.py

P_THRESHOLD = 1e-4
LENGTH = 3  # tokens of each sequence whose joint distribution is tested


def make_world(vocab: int, num_draft: int, seed: int, scale: float):
    """Target and draft rows for the positions a sequence of LENGTH tokens can reach."""
    return worlds.make_world(vocab, LENGTH + num_draft + 1, seed, scale)


def broken_block_op(draft_probs, draft_token_ids, target_probs, accepted, emitted, seed, offset):
    """Block verification that samples relu(p - q) at tau instead of relu(w_tau p - q)."""
    drafts = block.read_drafts(draft_probs, draft_token_ids, target_probs, seed, offset)
    rows = block.candidate_rows(draft_probs, target_probs, drafts, drafts.weights)
    tau = block.choose_tau(block.stop_probabilities(rows, drafts), drafts)
    unweighted = block.candidate_rows(draft_probs, target_probs, drafts, torch.ones_like(drafts.weights))
    token = block.sample_at(unweighted, target_probs, tau, drafts)
    return write_outputs(drafts.ids, tau, token, drafts.accepted, accepted, emitted)


def public_op(verification):
    def run(draft_probs, ids, target_probs, accepted, emitted, seed, offset):
        out, _, _ = specops.chain_speculative_sampling(
            draft_probs, ids, target_probs, accepted, emitted, seed=seed, offset=offset,
            verification=verification)
        return out
    return run


def draw(rows, generator):
    """One token per row of probabilities, by inverse CDF of torch.rand (whose stream, unlike
    torch.multinomial's, is the same in every torch release)."""
    u = torch.rand(rows.shape[0], 1, generator=generator, dtype=torch.float64)
    below = (rows.double().cumsum(-1) < u * rows.double().sum(-1, keepdim=True)).sum(-1)
    return below.clamp_max(rows.shape[-1] - 1)


def decode(op, p, q, num_draft, sequences, seed, greedy=False):
    """Decode LENGTH tokens of ``sequences`` sequences; returns (tokens (M, LENGTH), calls made,
    tokens emitted by all calls)."""
    vocab = p.shape[1]
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((sequences, LENGTH + num_draft + 1), -1, dtype=torch.int64)
    length = torch.zeros(sequences, dtype=torch.int64)
    p32, q32 = p.float(), q.float()
    calls, step = 0, 0
    while bool((length < LENGTH).any()):
        active = (length < LENGTH).nonzero().squeeze(1)
        n = length[active]
        at = n[:, None] + torch.arange(num_draft + 1)
        target_rows = p32[at]  # (M, N + 1, V)
        draft_rows = q32[at[:, :num_draft]]
        if greedy:
            ids, draft_probs = draft_rows.argmax(-1), None
        else:
            ids = draw(draft_rows.reshape(-1, vocab), g).reshape(-1, num_draft)
            draft_probs = draft_rows
        counters = torch.zeros(2, active.numel(), dtype=torch.int32)
        out = op(draft_probs, ids, target_rows, counters[0], counters[1],
                 torch.tensor([1000 + seed * 100 + step]), torch.tensor([step]))
        kept = (out >= 0).sum(1)
        cols = n[:, None] + torch.arange(num_draft + 1)
        tokens[active[:, None], cols] = torch.where(out >= 0, out.long(), tokens[active[:, None], cols])
        length[active] += kept
        calls += active.numel()
        step += 1
    return tokens[:, :LENGTH], calls


# (V, N, seed, scale). The first three are worlds where weighting the residual matters enough for
# 20000 sequences to tell (found by trying seeds; in many worlds the unweighted variant is off by
# less than that).
DETECTABLE = [(5, 3, 1, 2.0), (4, 4, 8, 1.0), (5, 3, 8, 2.0)]
WORLDS = DETECTABLE + [(4, 2, 0, 2.0)]


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("vocab,num_draft,seed,scale", WORLDS)
def test_sequences_follow_the_target(verification, vocab, num_draft, seed, scale):
    p, q = make_world(vocab, num_draft, seed, scale)
    tokens, _ = decode(public_op(verification), p, q, num_draft, 20000, seed)
    assert worlds.joint_pvalue(tokens, p) > P_THRESHOLD


@pytest.mark.parametrize("verification", ["token", "block"])
def test_greedy_drafts_sequences_follow_the_target(verification):
    p, q = make_world(4, 3, 7, 2.0)
    tokens, _ = decode(public_op(verification), p, q, 3, 20000, 7, greedy=True)
    assert worlds.joint_pvalue(tokens, p) > P_THRESHOLD


@pytest.mark.parametrize("vocab,num_draft,seed,scale", DETECTABLE)
def test_detector_catches_unweighted_residual(vocab, num_draft, seed, scale):
    p, q = make_world(vocab, num_draft, seed, scale)
    tokens, _ = decode(broken_block_op, p, q, num_draft, 20000, seed)
    assert worlds.joint_pvalue(tokens, p) < P_THRESHOLD


# ----------------------------------------------------------------------------------------------
# Block verification keeps at least as many drafts as token verification, in expectation.


def exact_emitted(p, q):
    """(E[tau], E[tau^2]) of block verification and (E[e], E[e^2]) of token verification for one
    call with target rows p (N+1, V), draft rows q (N, V) and drafts drawn from q: enumeration of
    every draft, with the paper's formulas written out here in float64 (not the op's code)."""
    num_draft, vocab = q.shape
    block_moments = torch.zeros(2, dtype=torch.float64)
    for drafts in itertools.product(range(vocab), repeat=num_draft):
        prob, w, h = 1.0, 1.0, []
        for t, d in enumerate(drafts, start=1):
            prob *= float(q[t - 1, d])
            w = min(1.0, w * float(p[t - 1, d]) / float(q[t - 1, d]))
            nxt = q[t] if t < num_draft else torch.zeros(vocab, dtype=torch.float64)
            m = float((w * p[t] - nxt).clamp_min(0).sum())
            h.append(1.0 if m + 1 - w == 0 else m / (m + 1 - w))
        for tau in range(1, num_draft + 1):
            chance = h[tau - 1] * math.prod(1 - x for x in h[tau:])
            block_moments += prob * chance * torch.tensor([tau, tau * tau], dtype=torch.float64)
    beta = torch.minimum(p[:num_draft], q).sum(-1)
    reach = torch.cumprod(beta, 0)  # P(e >= k), k = 1..N
    k = torch.arange(1, num_draft + 1, dtype=torch.float64)
    token_moments = torch.stack([reach.sum(), ((2 * k - 1) * reach).sum()])
    return block_moments, token_moments


def test_block_keeps_at_least_as_many_drafts_in_expectation():
    gains = []
    for seed in range(60):
        vocab, num_draft = 3 + seed % 2, 2 + seed % 2
        g = torch.Generator().manual_seed(seed)
        scale = 0.5 + 2.5 * float(torch.rand(1, generator=g))
        p = torch.softmax(scale * torch.randn(num_draft + 1, vocab, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(scale * torch.randn(num_draft, vocab, generator=g, dtype=torch.float64), -1)
        block_moments, token_moments = exact_emitted(p, q)
        assert block_moments[0] >= token_moments[0] - 1e-12, seed
        gains.append(float(block_moments[0] - token_moments[0]))
    assert sum(gains) / len(gains) > 0.01  # strictly more on average


@pytest.mark.parametrize("verification", ["token", "block"])
def test_op_emits_the_exact_expectation(verification):
    """The op's mean emitted count matches the enumeration (a normal test on 20000 requests)."""
    vocab, num_draft, requests = 4, 3, 20000
    p, q = make_world(vocab, num_draft, 1, 2.0)
    p, q = p[: num_draft + 1], q[:num_draft]
    block_moments, token_moments = exact_emitted(p, q)
    mean, second = block_moments if verification == "block" else token_moments
    g = torch.Generator().manual_seed(3)
    ids = torch.multinomial(q.float(), requests, replacement=True, generator=g).T.contiguous()
    target = p.float().expand(requests, -1, -1)
    draft = q.float().expand(requests, -1, -1)
    _, _, emitted = specops.chain_speculative_sampling(draft, ids, target, seed=11,
                                                        verification=verification)
    observed = emitted.double().mean().item()
    assert normal_pvalue(observed, float(mean), float(second - mean**2), requests) > P_THRESHOLD
