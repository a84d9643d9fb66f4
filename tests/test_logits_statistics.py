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
from specops.core.logits.rule import packed_bitmask

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


def process(logits: torch.Tensor, params: dict, min_p_last: bool = False) -> torch.Tensor:
    """The processed rows (positions, V) float64, every row with the same parameters (in
    transformers' order where ``min_p_last``)."""
    rows = logits.shape[0]
    full = {name: torch.full((rows,), params.get(name, off), dtype=dtype)
            for name, (dtype, off) in (("temperature", (torch.float32, 1.0)),
                                       ("top_k", (torch.int64, 0)),
                                       ("top_p", (torch.float32, 1.0)),
                                       ("min_p", (torch.float32, 0.0)))}
    return processing.processed_rows(logits, **full, min_p_last=min_p_last).double()


def draw(rows: torch.Tensor, generator) -> torch.Tensor:
    """One token per row of probabilities, by inverse CDF of torch.rand."""
    u = torch.rand(rows.shape[0], 1, generator=generator, dtype=torch.float64)
    below = (rows.cumsum(-1) < u * rows.sum(-1, keepdim=True)).sum(-1)
    return below.clamp_max(rows.shape[-1] - 1)


def decode(target, draft, params, draft_source, verification, seed, op=None, draft_params=None,
           declared=True, bias=None, allowed=None):
    """Decode LENGTH tokens of SEQUENCES sequences: (tokens (M, LENGTH), tokens per call).
    draft_params: the parameters the drafter samples the draft's logits with (default: the
    target's), passed to the op as draft_* where ``declared``. bias (V,): every request's logit
    bias; allowed (positions, V) bool: each position's grammar mask."""
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
        if bias is not None:
            kwargs["logit_bias"] = bias.expand(active.numel(), -1)
        if allowed is not None:
            kwargs["allowed_token_bitmask"] = packed_bitmask(allowed[at])
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


def mask_world(seed: int):
    """A logit bias (V,) and each position's grammar mask (positions, V): 3-5 of 7 tokens."""
    g = torch.Generator().manual_seed(seed)
    positions = LENGTH + NUM_DRAFT + 1
    allowed = torch.rand(positions, VOCAB, generator=g).argsort(-1) < torch.randint(
        3, 6, (positions, 1), generator=g)
    return torch.randn(VOCAB, generator=g), allowed


def adjusted(target, bias, allowed):
    return torch.where(allowed, target + bias, -torch.inf)


def mask_after_top_k_op(draft_probs, ids, target_logits, *, logit_bias, allowed_token_bitmask,
                        top_k, **kwargs):
    """Broken on purpose: top-k taken over the biased logits before the mask removes tokens (the
    mask applied after truncation, not first)."""
    x = target_logits + logit_bias[:, None, :]
    kept = x >= x.topk(top_k, dim=-1).values[..., -1:]
    allowed = processing.allowed_tokens(allowed_token_bitmask, x.shape[-1])
    return specops.chain_speculative_sampling_from_logits(
        draft_probs, ids, torch.where(kept & allowed, x, -torch.inf), **kwargs)


@pytest.mark.parametrize("verification, draft_source", [("token", "logits"), ("block", "probs")])
def test_sequences_follow_the_masked_and_biased_target(verification, draft_source):
    # Mask first, bias, then temperature and top-k: what the target's requests decode.
    params = dict(temperature=0.8, top_k=3)
    target, draft = make_world(seed=10)
    bias, allowed = mask_world(seed=11)
    tokens, _ = decode(target, draft, params, draft_source, verification, seed=12, bias=bias,
                       allowed=allowed)
    assert worlds.joint_pvalue(tokens, process(adjusted(target, bias, allowed), params)) > \
        P_THRESHOLD
    broken, _ = decode(target, draft, params, draft_source, verification, seed=12, bias=bias,
                       allowed=allowed, op=mask_after_top_k_op)
    assert worlds.joint_pvalue(broken, process(adjusted(target, bias, allowed), params)) < \
        P_THRESHOLD


# Penalties: the target's distribution at a position depends on the tokens generated before it,
# so the expected joint distribution is built one position at a time, here, in float64.
PENALTIES = dict(repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3)
BASE_COUNTS = torch.tensor([0, 2, 0, 1, 0, 0, 3])  # the output so far, before the sequences
PROMPT = torch.tensor([1, 0, 0, 0, 1, 0, 0], dtype=torch.bool)


def penalized_by_hand(row: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """One row of logits (V,) float64 under PENALTIES with these counts, as vLLM applies them."""
    seen = (counts > 0) | PROMPT
    r = PENALTIES["repetition_penalty"]
    row = torch.where(seen, torch.where(row > 0, row / r, row * r), row)
    return (row - PENALTIES["frequency_penalty"] * counts
            - PENALTIES["presence_penalty"] * (counts > 0).double())


def expected_with_penalties(target: torch.Tensor, params: dict, bias=None, allowed=None,
                            min_p_last=False) -> torch.Tensor:
    """The joint distribution (V ** LENGTH,) of the first LENGTH tokens (index tok_0 + V tok_1
    + ...), each position's row processed after the tokens before it are counted (and, where
    given, masked by ``allowed`` and biased first)."""
    expected = torch.ones(1, dtype=torch.float64)
    histories = [torch.zeros(0, dtype=torch.long)]  # the prefixes, in index order
    for t in range(LENGTH):
        rows = []
        for prefix in histories:
            counts = BASE_COUNTS + torch.bincount(prefix, minlength=VOCAB)
            row = target[t].double()
            if bias is not None:
                row = torch.where(allowed[t], row + bias.double(), -torch.inf)
            rows.append(process(penalized_by_hand(row, counts)[None].float(), params,
                                min_p_last)[0])
        step = torch.stack(rows) * expected[:, None]  # (prefixes, V): prefix then token
        expected = step.T.reshape(-1)  # index prefix + V**t token
        histories = [torch.cat([prefix, torch.tensor([v])]) for v in range(VOCAB)
                     for prefix in histories]
    return expected


def decode_with_penalties(target, draft, params, verification, seed, count_drafts=True,
                          bias=None, allowed=None, draft_params=None, order="vllm"):
    """decode's loop with each sequence's own output counts; count_drafts=False is broken on
    purpose: every row penalised by the output alone, the drafts before it not counted. Where
    given, every request's bias and each position's mask, the drafter's own parameters, and the
    processing order go to the op too."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((SEQUENCES, LENGTH + NUM_DRAFT + 1), -1, dtype=torch.int64)
    length = torch.zeros(SEQUENCES, dtype=torch.int64)
    draft_rows = process(draft, draft_params or params, order == "transformers")
    extra = {f"draft_{name}": value for name, value in (draft_params or {}).items()}
    step = 0
    while bool((length < LENGTH).any()):
        active = (length < LENGTH).nonzero().squeeze(1)
        at = length[active][:, None] + torch.arange(NUM_DRAFT + 1)
        ids = draw(draft_rows[at[:, :NUM_DRAFT]].reshape(-1, VOCAB), g).reshape(-1, NUM_DRAFT)
        done = torch.where(torch.arange(tokens.shape[1]) < length[active][:, None],
                           tokens[active], VOCAB)  # VOCAB: not generated yet
        counts = BASE_COUNTS + torch.nn.functional.one_hot(done, VOCAB + 1)[..., :VOCAB].sum(1)
        kwargs = dict(seed=torch.tensor([2000 + seed * 100 + step]), offset=torch.tensor([step]),
                      verification=verification, draft_logits=draft[at[:, :NUM_DRAFT]],
                      processing_order=order, **params, **extra)
        rows = target[at]
        if count_drafts:
            kwargs.update(PENALTIES, output_token_counts=counts,
                          prompt_token_mask=PROMPT.expand(active.numel(), -1))
            if bias is not None:
                kwargs.update(logit_bias=bias.expand(active.numel(), -1),
                              allowed_token_bitmask=packed_bitmask(allowed[at]))
        else:  # step 0 by hand, each row with the output's counts only
            if bias is not None:
                rows = torch.where(allowed[at], rows + bias, -torch.inf)
            rows = torch.stack([torch.stack([penalized_by_hand(row.double(), c).float()
                                             for row in request])
                                for request, c in zip(rows, counts)])
        out, _, _ = specops.chain_speculative_sampling_from_logits(None, ids, rows, **kwargs)
        tokens[active[:, None], at] = torch.where(out >= 0, out.long(), tokens[active[:, None], at])
        length[active] += (out >= 0).sum(1)
        step += 1
    return tokens[:, :LENGTH]


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sequences_follow_the_penalised_target(verification):
    # The drafts before a position count as generated: exactly what decoding one token at a time
    # would use. Leaving them out (every position penalised by the output alone) must fail.
    params = dict(temperature=0.9)
    target, draft = make_world(seed=13, scale=1.0)
    draft = target + 0.3 * (draft - target)  # drafts that often agree, so they repeat
    expected = expected_with_penalties(target, params)
    tokens = decode_with_penalties(target, draft, params, verification, seed=14)
    index = (tokens * VOCAB ** torch.arange(LENGTH)).sum(1)
    counts = torch.bincount(index, minlength=VOCAB**LENGTH)
    assert worlds.chi2_pvalue(counts, expected) > P_THRESHOLD
    broken = decode_with_penalties(target, draft, params, verification, seed=14,
                                   count_drafts=False)
    index = (broken * VOCAB ** torch.arange(LENGTH)).sum(1)
    assert worlds.chi2_pvalue(torch.bincount(index, minlength=VOCAB**LENGTH), expected) < \
        P_THRESHOLD


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sequences_follow_the_target_with_every_feature_at_once(verification):
    # Mask, bias and penalties (the drafts counted), then temperature, top-k and min-p in
    # transformers' order, the drafter sampling with its own temperature: the whole sampling
    # step at once. The same call with the drafts not counted must fail.
    params = dict(temperature=0.9, top_k=5, min_p=0.05)
    target, draft = make_world(seed=13, scale=1.0)
    draft = target + 0.3 * (draft - target)  # drafts that often agree, so they repeat
    bias, allowed = mask_world(seed=16)
    bias = 0.5 * bias
    allowed[:, target[0].topk(3).indices] = True  # the likely tokens stay, to be repeated
    features = dict(bias=bias, allowed=allowed, draft_params=dict(params, temperature=0.7),
                    order="transformers")
    expected = expected_with_penalties(target, params, bias, allowed, min_p_last=True)
    for count_drafts in (True, False):
        tokens = decode_with_penalties(target, draft, params, verification, seed=17,
                                       count_drafts=count_drafts, **features)
        index = (tokens * VOCAB ** torch.arange(LENGTH)).sum(1)
        p = worlds.chi2_pvalue(torch.bincount(index, minlength=VOCAB**LENGTH), expected)
        assert p > P_THRESHOLD if count_drafts else p < P_THRESHOLD


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
