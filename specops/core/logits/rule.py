"""Rows of logits turned into the distributions each request's sampling parameters ask for: the
plain reference of the rule every sampler that takes logits applies (docs/semantics.md,
"Verification from logits"), in vLLM's sampler order, row by row.

For a row of logits x (read as float32) and its request's temperature T, top-k k, top-p P and
min-p M:

1. A logit that is NaN or infinite counts as -inf: it is never kept.
2. T == 0: the row is greedy, one-hot at its largest logit (the lowest index on ties).
3. T > 0: the weights e = exp2((x - max(x)) * c), c = log2(e) / T, all float32: the softmax of
   x / T before normalising, 1 at the largest logit.
4. min-p: keep the tokens with e >= M (p >= M * max(p)); M == 0 keeps all.
5. top-k: of what is left, keep the tokens with e at least the k-th largest e (ties kept);
   k == 0 or k >= V keeps all.
6. top-p: of what is left, keep the tokens with e >= t, for the largest t among their weights
   whose kept mass W(t) = sum(e >= t) is at least P * W(0); P == 1 keeps all. Masses are exact
   sums of the float32 chunk masses (core/sampling/sums.py), compared in float64.
7. p = e * r for the kept tokens, r = 1 / W (W the kept mass; r rounded to float32), 0 elsewhere.

A request whose parameters are out of range (T negative or NaN, k negative, P outside (0, 1], M
outside [0, 1]) has rows without mass; validation mode refuses them. A row without a finite logit
has no mass either. Every step reads its own row and its own request's parameters only.
"""

from __future__ import annotations

import math

import torch

from ..sampling.race import chunk_masses
from ..sampling.sums import exact_total

LOG2E = float(torch.tensor(1 / math.log(2), dtype=torch.float32))  # log2(e), as float32


def weights(logits: torch.Tensor, temperature: torch.Tensor, peak: torch.Tensor | None = None):
    """Steps 1 and 3 for rows (R, V) and their temperatures (R,): (valid logits (R, V) bool,
    float32 weights e (R, V), 0 where invalid; rows without a valid logit have none).

    peak: each row's largest valid logit (R, 1) float32, given when the rows are shards of longer
    rows (a vocabulary shard); by default the rows' own."""
    x = logits.float()
    valid = torch.isfinite(x)
    if peak is None:
        peak = torch.where(valid, x, -torch.inf).amax(dim=-1, keepdim=True)
    c = (LOG2E / temperature.float())[:, None]  # float32 division, correctly rounded
    e = torch.where(valid, torch.exp2((x - peak) * c), 0.0)
    return valid, e


def greedy_rows(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Step 2: one-hot float32 rows at the largest valid logit (the lowest index on ties); all
    zero where a row has no valid logit."""
    x = torch.where(valid, logits.float(), -torch.inf)
    top = x.argmax(dim=-1)  # the first of equal maxima
    one_hot = torch.nn.functional.one_hot(top, x.shape[-1]).float()
    return torch.where(valid.any(dim=-1, keepdim=True), one_hot, 0.0)


def kept_mass(e: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """float64 (R,): the exact sum of the float32 chunk masses of the kept weights."""
    return exact_total(chunk_masses(torch.where(keep, e, 0.0)))


def top_k_threshold(e: torch.Tensor, keep: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Step 5's threshold (R, 1): the k-th largest kept weight, or -1 (keep all) where k is 0,
    at least V, or more than the tokens kept."""
    vocab = e.shape[-1]
    ranked = torch.where(keep, e, -1.0).sort(dim=-1, descending=True).values
    k = top_k.long()
    active = (k > 0) & (k < vocab)
    kth = ranked.gather(-1, (k.clamp(1, vocab) - 1)[:, None])
    return torch.where(active[:, None], kth, -1.0)


def top_p_threshold(e: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Step 6's threshold (R, 1): the largest kept weight t with W(t) >= P * W(0), found by
    bisection over the kept weights in descending order (W grows along it); -1 where P >= 1."""
    ranked = torch.where(keep, e, -1.0).sort(dim=-1, descending=True).values
    goal = top_p.double() * kept_mass(e, keep)
    # The answer's index in `ranked` is in [lo, hi]: W(ranked[count - 1]) = W(0) >= goal.
    lo = torch.zeros_like(goal, dtype=torch.long)
    hi = (keep.sum(dim=-1) - 1).clamp(min=0)
    for _ in range(max(1, e.shape[-1]).bit_length()):
        mid = (lo + hi) // 2
        t = ranked.gather(-1, mid[:, None])
        enough = kept_mass(e, keep & (e >= t)) >= goal
        hi = torch.where(enough, mid, hi)
        lo = torch.where(enough, lo, mid + 1)
    threshold = ranked.gather(-1, hi[:, None])
    return torch.where((top_p < 1)[:, None], threshold, -1.0)


def out_of_range(temperature, top_k, top_p, min_p) -> torch.Tensor:
    """(R,) bool: the requests whose parameters lie outside their ranges (their rows get no
    mass)."""
    return ~((temperature >= 0) & (top_k >= 0) & (top_p > 0) & (top_p <= 1) & (min_p >= 0)
             & (min_p <= 1))


def processed_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The float32 distributions (R, V) of rows of logits (R, V) under each row's parameters
    (R,) (temperature, top_p, min_p float; top_k int): steps 1-7 above."""
    valid, e = weights(logits, temperature)
    keep = valid & (e >= min_p.float()[:, None])
    keep &= e >= top_k_threshold(e, keep, top_k)
    keep &= e >= top_p_threshold(e, keep, top_p)
    return finished_rows(e, keep, kept_mass(e, keep), greedy_rows(logits, valid), temperature,
                         top_k, top_p, min_p)


def finished_rows(e, keep, mass, greedy, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """Step 7 from the kept weights and their exact mass (R,) float64, then the greedy rows
    (T == 0) and the rows without mass (parameters out of range)."""
    scale = (1.0 / mass).float()[:, None]  # inf without mass: nothing is kept then
    sampled = torch.where(keep, e * scale, 0.0)
    rows = torch.where((temperature == 0)[:, None], greedy, sampled)
    return torch.where(out_of_range(temperature, top_k, top_p, min_p)[:, None], 0.0, rows)


def processed_requests(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, min_p: torch.Tensor, process=None) -> torch.Tensor:
    """The float32 rows (B, rows, V) of requests' rows of logits (B, rows, V), each request's
    parameters (1 or B values each) applied to every row of it, by ``process`` (the rows (R, V)
    and R values each: ``processed_rows`` by default, or a faster way to the same rows)."""
    batch, rows, vocab = logits.shape
    out = (process or processed_rows)(
        logits.reshape(batch * rows, vocab), *(per_row(value, batch, rows)
                                               for value in (temperature, top_k, top_p, min_p)))
    return out.reshape(batch, rows, vocab)


def drafts_own(draft_parameters, parameters) -> tuple:
    """The parameters (temperature, top_k, top_p, min_p) that process draft logits: the draft's
    own where given, the target's where None (the drafter sampled as the target is sampled)."""
    return tuple(t if d is None else d for d, t in zip(draft_parameters, parameters))


def per_row(value: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
    """A parameter of 1 or B values (one per request) as one value per row of the requests'
    (B, rows, V) rows, flattened: (B * rows,)."""
    if batch == 1:  # one request: its value for every row, as a view
        return value.expand(rows)
    return value.expand(batch).repeat_interleave(rows)
