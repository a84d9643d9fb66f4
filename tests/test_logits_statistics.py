"""Verification from logits is exact for the distribution the sampling parameters ask for.

Sequences are decoded by repeated calls of ``chain_speculative_sampling_from_logits`` in small
worlds whose target and draft logits depend on the absolute position alone; there the target's
sequences are independent tokens, token t drawn from the processed row P_t (core/logits/rule.py), and
the chi-square test compares the joint distribution of the first LENGTH tokens with the product
of the P_t. This holds for token and block verification alike (block verification is exact only
for whole sequences), with drafts drawn from draft probabilities or from the draft's processed
logits (with the target's parameters or the draft's own). A variant that leaves the temperature
out of the draft side, or processes the draft's logits with the target's parameters where the
drafter sampled with its own, must fail the same test.
Greedy requests (temperature 0) must give greedy decoding's tokens exactly. Fixed seeds.
"""

from __future__ import annotations

import pytest
import torch

import specops
from specops.core.logits import rule as processing

import worlds  # tests/worlds.py

P_THRESHOLD = 1e-4
LENGTH = 2  # tokens of each sequence whose joint distribution is tested
VOCAB, NUM_DRAFT = 7, 2
SEQUENCES = 20000


def make_world(seed: int, scale: float = 1.5):
    """Target and draft logits, one row per absolute position: (positions, V) float32 each; the
    draft's is a noisy copy of the target's, as a draft model's would be."""
    g = torch.Generator().manual_seed(seed)
    positions = LENGTH + NUM_DRAFT + 1
    target = scale * torch.randn(positions, VOCAB, generator=g)
    draft = target + 0.8 * torch.randn(positions, VOCAB, generator=g)
    return target, draft


def process(logits: torch.Tensor, params: dict) -> torch.Tensor:
    """The processed rows (positions, V) float64, every row with the same parameters."""
    rows = logits.shape[0]
    full = {name: torch.full((rows,), params.get(name, off), dtype=dtype)
            for name, (dtype, off) in (("temperature", (torch.float32, 1.0)),
                                       ("top_k", (torch.int64, 0)),
                                       ("top_p", (torch.float32, 1.0)),
                                       ("min_p", (torch.float32, 0.0)))}
    return processing.processed_rows(logits, **full).double()


def draw(rows: torch.Tensor, generator) -> torch.Tensor:
    """One token per row of probabilities, by inverse CDF of torch.rand."""
    u = torch.rand(rows.shape[0], 1, generator=generator, dtype=torch.float64)
    below = (rows.cumsum(-1) < u * rows.sum(-1, keepdim=True)).sum(-1)
    return below.clamp_max(rows.shape[-1] - 1)


def decode(target, draft, params, draft_source, verification, seed, op=None, draft_params=None,
           declared=True):
    """Decode LENGTH tokens of SEQUENCES sequences: (tokens (M, LENGTH), tokens per call).
    draft_params: the parameters the drafter samples the draft's logits with (default: the
    target's), passed to the op as draft_* where ``declared``."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((SEQUENCES, LENGTH + NUM_DRAFT + 1), -1, dtype=torch.int64)
    length = torch.zeros(SEQUENCES, dtype=torch.int64)
    draft_rows = process(draft, draft_params or params) if draft_source == "logits" else \
        torch.softmax(draft.double(), -1)
    if draft_params and declared:
        params = dict(params, **{f"draft_{name}": value for name, value in draft_params.items()})
    calls, step = 0, 0
    while bool((length < LENGTH).any()):
        active = (length < LENGTH).nonzero().squeeze(1)
        at = length[active][:, None] + torch.arange(NUM_DRAFT + 1)
        ids = draw(draft_rows[at[:, :NUM_DRAFT]].reshape(-1, VOCAB), g).reshape(-1, NUM_DRAFT)
        kwargs = dict(seed=torch.tensor([1000 + seed * 100 + step]),
                      offset=torch.tensor([step]), verification=verification, **params)
        if draft_source == "logits":
            kwargs["draft_logits"] = draft[at[:, :NUM_DRAFT]]
            draft_probs = None
        else:
            draft_probs = draft_rows[at[:, :NUM_DRAFT]].float()
        out, _, _ = (op or specops.chain_speculative_sampling_from_logits)(
            draft_probs, ids, target[at], **kwargs)
        cols = at
        tokens[active[:, None], cols] = torch.where(out >= 0, out.long(),
                                                    tokens[active[:, None], cols])
        length[active] += (out >= 0).sum(1)
        calls += active.numel()
        step += 1
    return tokens[:, :LENGTH], calls


PROCESSING = {"none": {}, "min_p": dict(min_p=0.15), "top_k": dict(top_k=3),
              "top_p": dict(top_p=0.7), "all": dict(min_p=0.05, top_k=4, top_p=0.8)}
# Every processing at every temperature; verification mode and draft source rotate through the
# four pairs, so each pair meets every processing and every temperature.
PAIRS = [("token", "probs"), ("block", "logits"), ("token", "logits"), ("block", "probs")]
GRID = [(t, name, *PAIRS[(i + j) % 4]) for i, t in enumerate((0.5, 1.0, 2.0))
        for j, name in enumerate(PROCESSING)]


@pytest.mark.parametrize("temperature,processing,verification,draft_source", GRID)
def test_sequences_follow_the_processed_target(temperature, processing, verification,
                                                draft_source):
    params = dict(temperature=temperature, **PROCESSING[processing])
    target, draft = make_world(seed=int(temperature * 10) + len(processing))
    tokens, _ = decode(target, draft, params, draft_source, verification, seed=3)
    assert worlds.joint_pvalue(tokens, process(target, params)) > P_THRESHOLD


def cold_draft_op(draft_probs, ids, target_logits, *, draft_logits, temperature, **kwargs):
    """Broken on purpose: the draft's logits processed without the temperature (logits times T
    at temperature T are the logits at temperature 1), while the drafts were drawn with it."""
    return specops.chain_speculative_sampling_from_logits(
        draft_probs, ids, target_logits, draft_logits=draft_logits * temperature,
        temperature=temperature, **kwargs)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_detector_catches_the_temperature_left_out_of_the_draft(verification):
    params = dict(temperature=0.5)
    target, draft = make_world(seed=4)
    honest, _ = decode(target, draft, params, "logits", verification, seed=5)
    assert worlds.joint_pvalue(honest, process(target, params)) > P_THRESHOLD
    broken, _ = decode(target, draft, params, "logits", verification, seed=5, op=cold_draft_op)
    assert worlds.joint_pvalue(broken, process(target, params)) < P_THRESHOLD


@pytest.mark.parametrize("verification", ["token", "block"])
def test_the_draft_sampled_with_its_own_parameters(verification):
    # The drafter samples colder and truncated where the target's requests are not: exact only
    # when the op is told (draft_*); processing the draft's logits with the target's parameters
    # must fail the same test.
    params = dict(temperature=1.0, top_p=0.9)
    draft_params = dict(temperature=0.6, top_k=4, top_p=1.0, min_p=0.02)
    target, draft = make_world(seed=8)
    honest, _ = decode(target, draft, params, "logits", verification, seed=9,
                       draft_params=draft_params)
    assert worlds.joint_pvalue(honest, process(target, params)) > P_THRESHOLD
    broken, _ = decode(target, draft, params, "logits", verification, seed=9,
                       draft_params=draft_params, declared=False)
    assert worlds.joint_pvalue(broken, process(target, params)) < P_THRESHOLD


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("draft_source", ["probs", "logits", "greedy"])
def test_greedy_requests_decode_greedily(verification, draft_source):
    target, draft = make_world(seed=6)
    g = torch.Generator().manual_seed(7)
    batch = 300
    start = torch.randint(0, LENGTH + 1, (batch,), generator=g)
    at = start[:, None] + torch.arange(NUM_DRAFT + 1)
    draft_rows = torch.softmax(draft[at[:, :NUM_DRAFT]], -1)
    ids = draw(draft_rows.reshape(-1, VOCAB).double(), g).reshape(batch, NUM_DRAFT)
    kwargs = dict(temperature=0.0, seed=torch.arange(batch), verification=verification)
    draft_probs = None
    if draft_source == "probs":
        draft_probs = draft_rows
    elif draft_source == "logits":
        kwargs["draft_logits"] = draft[at[:, :NUM_DRAFT]]
        ids = draft[at[:, :NUM_DRAFT]].argmax(-1)  # a greedy draft's own choices
    else:
        ids = draft[at[:, :NUM_DRAFT]].argmax(-1)
    out, accepted, emitted = specops.chain_speculative_sampling_from_logits(
        draft_probs, ids, target[at], **kwargs)
    greedy = target[at].argmax(-1)  # (B, N + 1): the target's own choice at every position
    matches = (ids == greedy[:, :NUM_DRAFT]).long().cumprod(1).sum(1)  # drafts kept
    assert torch.equal(emitted.long(), matches)
    for b in range(batch):
        k = int(matches[b])
        assert out[b, :k].tolist() == ids[b, :k].tolist()
        assert int(out[b, k]) == int(greedy[b, k])  # the argmax at the first mismatch
    assert torch.equal(accepted.long(), (ids == greedy[:, :NUM_DRAFT]).sum(1))
