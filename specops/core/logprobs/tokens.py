"""Each wanted token's logprob from its logit and its row's quantities, by torch operations on
(R, K) values: what the CPU backend and the Triton launcher share (the reference computes whole
rows instead, ``rule.py``). No processed row is written."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .rule import LN2

NO_MASS, SAMPLED, GREEDY = 0, 1, 2  # as core/sampling/values_triton.py's modes


class RowFacts(NamedTuple):
    """What a row's logprobs need, each (R, 1): its mode, its largest valid logit m (float32),
    c = log2(e) / T (float32), log(W) (float64; W the kept mass) and a greedy row's token."""

    mode: torch.Tensor
    peak: torch.Tensor
    coef: torch.Tensor
    log_mass: torch.Tensor
    index: torch.Tensor


def at_tokens(x: torch.Tensor, facts: RowFacts, ids: torch.Tensor, vocab: int,
              kept: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """float32 (R, K): the logprobs of tokens ids (R, K) of rows whose float32 logits at the ids
    (clamped into [0, V)) are x (R, K); ``kept`` (clamped ids, x) says which the rule keeps. -inf
    for an id outside [0, V)."""
    inside = (ids >= 0) & (ids < vocab)
    clamped = ids.clamp(0, vocab - 1)
    log_e = ((x - facts.peak) * facts.coef).double() * LN2
    sampled = torch.where(kept(clamped, x), log_e - facts.log_mass, -torch.inf)
    greedy = torch.where(ids == facts.index, 0.0, -torch.inf).double()
    values = torch.where(facts.mode == SAMPLED, sampled,
                         torch.where(facts.mode == GREEDY, greedy, -torch.inf))
    return torch.where(inside, values, -torch.inf).float()


def token_logprobs(logits_at: Callable[[torch.Tensor], torch.Tensor], vocab: int,
                   facts: RowFacts, token_ids, num_top: int, kept, ranked):
    """(logprobs (R, K), top ids (R, num_top) int32, top logprobs (R, num_top)) of R rows and their
    tokens (R, K): ``logits_at`` maps ids (R, K) in [0, V) to the rows' float32 logits there (as the
    rule reads them). ``ranked`` (with num_top > 0): (R, V) float32 whose num_top largest are each
    row's most likely tokens (the kept logits come first: a row keeps its largest logits, the
    weights growing with the logit)."""
    def logprobs_at(ids):
        return at_tokens(logits_at(ids.clamp(0, vocab - 1)), facts, ids, vocab, kept)

    per_row = token_ids.shape[2] if token_ids.dim() == 3 else 1  # (no -1: B P may be 0)
    ids = token_ids.reshape(facts.mode.shape[0], per_row).long()
    logprobs = logprobs_at(ids)
    if not num_top:
        empty = torch.zeros(ids.shape[0], 0, device=ids.device)
        return logprobs, empty.int(), empty
    top = ranked.topk(num_top, dim=-1).indices
    top_logprobs = logprobs_at(top)
    # A greedy row's one token is its own index, whichever of equal logits topk chose.
    first = torch.arange(num_top, device=ids.device) == 0
    greedy = facts.mode == GREEDY
    top = torch.where(greedy & first, facts.index, top)
    top_logprobs = torch.where(greedy, torch.where(first, 0.0, -torch.inf), top_logprobs)
    has = (top_logprobs > -torch.inf) & ((ids >= 0) & (ids < vocab)).any(dim=-1, keepdim=True)
    return (logprobs, torch.where(has, top, -1).int(),
            torch.where(has, top_logprobs, -torch.inf))
