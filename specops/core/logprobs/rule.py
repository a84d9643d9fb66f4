"""The log-probabilities of tokens under the distributions verification from logits samples:
the plain reference (docs/semantics.md, "Logprobs").

A sampled row's processed distribution gives a kept token p = e / W (core/logits/rule.py: e its
weight, W the kept mass). Its logprob is log(e) - log(W), with log(e) taken as (x - m) c ln 2,
the exponent before exp2 rounds it: a token whose weight underflows float32 keeps the finite
value ``log_softmax`` gives. A token not kept gets -inf; a greedy row (T == 0) is one-hot: 0 at
its token, -inf elsewhere; a row without mass is -inf throughout.
"""

from __future__ import annotations

import math

import torch

from ..logits import rule
from ..logits.rule import Step, listed_generated
from ..sampling.flattened import Padded

LN2 = math.log(2.0)


def logprob_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False
                 ) -> torch.Tensor:
    """float32 (R, V): the log-probabilities of rows of logits (R, V) under each row's parameters
    (R,), as ``rule.processed_rows`` processes them."""
    return _logprob_rows(logits, temperature, top_k, top_p, min_p, min_p_last).float()


def _logprob_rows(logits, temperature, top_k, top_p, min_p, min_p_last):
    """``logprob_rows`` in float64."""
    valid, e, keep = rule.kept_weights(logits, temperature, top_k, top_p, min_p, min_p_last)
    x = torch.where(valid, logits.float(), -torch.inf)
    peak = x.amax(dim=-1, keepdim=True)
    c = rule.coefficient(temperature)[:, None]  # as rule.weights has it
    log_e = ((x - peak) * c).double() * LN2
    sampled = torch.where(keep, log_e - rule.kept_mass(e, keep).log()[:, None], -torch.inf)
    greedy = torch.where(rule.greedy_rows(logits, valid) > 0, 0.0, -torch.inf).double()
    rows = torch.where((temperature == 0)[:, None], greedy, sampled)
    no_mass = rule.out_of_range(temperature, top_k, top_p, min_p)[:, None]
    return torch.where(no_mass, -torch.inf, rows)


def entropy_of(logprobs: torch.Tensor) -> torch.Tensor:
    """float32 (R,): the entropy -sum p ln p (nats) of rows given as their float64 logprobs (R, V)
    (``_logprob_rows``); 0 for a greedy row (one-hot) and a row without mass."""
    terms = torch.where(logprobs > -torch.inf, logprobs.exp() * logprobs, 0.0)
    return (0.0 - terms.sum(dim=-1)).float()  # 0.0 - 0.0 is +0


def selected(rows: torch.Tensor, logits: torch.Tensor, token_ids: torch.Tensor, num_top: int):
    """From log-probability rows (R, V), their logits (R, V) and each row's tokens (R, K) (an id
    outside [0, V): none): (their logprobs (R, K), the num_top most likely ids (R, num_top) int32
    and their logprobs); -inf for an id outside [0, V), and -1 with -inf where fewer than num_top
    tokens have probability (a row without a token has none). The most likely are the largest
    logits among the tokens with probability: equal logprobs of unequal logits (T = +inf) are
    ranked by the logits."""
    vocab = rows.shape[-1]
    ids = token_ids.long()
    inside = (ids >= 0) & (ids < vocab)
    at = rows.gather(1, ids.clamp(0, max(vocab - 1, 0)))
    logprobs = torch.where(inside, at, -torch.inf)
    ranked = torch.where(rows > -torch.inf, logits.float(), -torch.inf)
    top_ids = ranked.topk(num_top, dim=-1).indices
    values = rows.gather(1, top_ids)
    has = (values > -torch.inf) & inside.any(dim=-1, keepdim=True)
    return (logprobs, torch.where(has, top_ids, -1).int(),
            torch.where(has, values, -torch.inf))


def requests_rows(logits: torch.Tensor, token_ids: torch.Tensor, generated_ids=None,
                  cu_num_draft_tokens=None, *step) -> torch.Tensor:
    """The rows (B, P, V) the op's tokens token_ids (B, P, ...) are read under, rule step 0
    (``step``: ``rule.Step``'s fields) applied: the requests' rows of logits (B, P, V), row p
    counting as generated the first p ids of its list ``generated_ids`` (B, P, K)
    (``listed_generated``; None: none); or, given ``cu_num_draft_tokens`` (B + 1,), a flattened
    batch's rows (T + B, V) as the padded batch they stand for (``Padded``, P = max_num_draft_tokens
    + 1), its drafts ``generated_ids`` (T,), each row counting its request's drafts before it."""
    step = Step(*step)
    if cu_num_draft_tokens is not None:
        batch, positions = token_ids.shape[:2]
        padded = Padded(cu_num_draft_tokens, logits.shape[0] - batch, positions - 1)
        logits = padded.targets(logits)
        if step.allowed_token_bitmask is not None:
            step = step._replace(allowed_token_bitmask=padded.targets(step.allowed_token_bitmask))
        drafts = padded.ids(generated_ids)
        generated_ids = drafts[:, None, :].expand(batch, positions, -1)
    if not step.changes_logits():
        return logits
    return step.adjusted(logits, lambda counts: counts[:, None, :] if generated_ids is None
                         else listed_generated(counts, generated_ids))


def token_logprobs_reference(logits: torch.Tensor, token_ids: torch.Tensor,
                             temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                             min_p: torch.Tensor, num_top: int = 0,
                             processing_order: str = "vllm", entropy: bool = False,
                             *step_inputs):
    """The registered op's rule: the logprobs of token_ids (B, P) or (B, P, K) at each of the
    requests' rows (``requests_rows``: rule step 0 of ``step_inputs`` applied), each request's
    parameters (1 or B values) on every row of it, the num_top most likely tokens and, with
    ``entropy``, each row's entropy: ((B, P) float32, (B, P, num_top) int32, (B, P, num_top)
    float32, (B, P) or (B, 0) float32)."""
    logits = requests_rows(logits, token_ids, *step_inputs)
    batch, positions, vocab = logits.shape
    rows = _logprob_rows(logits.reshape(batch * positions, vocab),
                         *(rule.per_row(value, batch, positions)
                           for value in (temperature, top_k, top_p, min_p)),
                         rule.ORDERS[processing_order])
    per_row = token_ids.shape[2] if token_ids.dim() == 3 else 1
    logprobs, top_ids, top_logprobs = selected(
        rows.float(), logits.reshape(batch * positions, vocab),
        token_ids.reshape(batch * positions, per_row), num_top)
    entropies = entropy_of(rows).view(batch, positions) if entropy else rows.new_empty(
        (batch, 0), dtype=torch.float32)
    return (logprobs.view(token_ids.shape), top_ids.view(batch, positions, num_top),
            top_logprobs.view(batch, positions, num_top), entropies)
