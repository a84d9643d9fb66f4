"""The CPU backends' way of processing rows of logits: ``logits.processed_rows``'s rows, bit for
bit, with less work (tests/test_logits.py checks them against it).

On a CPU a question about the data costs no host synchronisation, so this path asks them:
  * each step runs on the rows that need it only (top-k where k is on, top-p where P < 1, the
    greedy rows where T == 0); every step is row-wise, so a subset of rows gets the same values;
  * top-k takes the k-th largest weight from ``torch.topk`` of the largest k over the rows,
    not from a sort of the whole row: the same value;
  * top-p ranks only the kept weights when top-k or min-p left few (``torch.topk``), and bisects
    over a narrow range of those ranks: a float64 running sum of the sorted weights
    estimates every rank's kept mass W to far better than the float32 chunk sums' rounding, the
    range is the ranks whose estimate lies within a margin of the goal, and two exact masses check
    that the answer lies in it (a row where they do not, e.g. for a tie, bisects its whole range,
    as the reference does). W grows along the ranks, so the bisection ends where the
    reference's does.
"""

from __future__ import annotations

import torch

from . import rule

# A float32 sum of a chunk's 1024 weights lies within 1024 * 2**-24 (about 6e-5) of its exact
# value, relative; so does the exact mass of the chunk sums against the estimate. 2**-12 covers it.
_MARGIN = 2.0**-12


def top_p_threshold(e: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``logits.top_p_threshold`` for rows whose P < 1, with fewer exact masses."""
    ranked = torch.where(keep, e, -1.0)
    most = int(keep.sum(dim=-1).max())  # the ranks past it hold -1 and are never the answer
    if most < ranked.shape[-1] // 8:  # top-k or min-p left few: their ranks, not the whole row
        ranked = ranked.topk(max(most, 1), dim=-1).values
    else:
        ranked = ranked.sort(dim=-1, descending=True).values
    total = rule.kept_mass(e, keep)
    goal = top_p.double() * total
    last = (keep.sum(dim=-1) - 1).clamp(min=0)
    estimate = ranked.clamp(min=0).cumsum(dim=-1, dtype=torch.float64)
    margin = (_MARGIN * total)[:, None]
    lo = torch.searchsorted(estimate, goal[:, None] - margin).squeeze(1).clamp(max=last)
    hi = torch.searchsorted(estimate, goal[:, None] + margin).squeeze(1).clamp(max=last)

    def enough(index):  # W(ranked[index]) >= goal, exactly as the reference decides it
        t = ranked.gather(-1, index[:, None])
        return rule.kept_mass(e, keep & (e >= t)) >= goal

    below = (lo - 1).clamp(min=0)
    inside = enough(hi) & ((lo == 0) | ~enough(below))
    lo = torch.where(inside, lo, 0)
    hi = torch.where(inside, hi, last)
    for _ in range(int((hi - lo).max()).bit_length() if hi.numel() else 0):
        mid = (lo + hi) // 2
        found = enough(mid)
        hi = torch.where(found, mid, hi)
        lo = torch.where(found, lo, mid + 1)
    return ranked.gather(-1, hi[:, None])


def top_k_threshold(e: torch.Tensor, keep: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """``logits.top_k_threshold`` for rows whose k is in [1, V): the k-th largest kept weight."""
    k = top_k.long()
    largest = torch.where(keep, e, -1.0).topk(int(k.max()), dim=-1).values
    return largest.gather(-1, (k - 1)[:, None])


def processed_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``logits.processed_rows``: the same float32 rows (R, V)."""
    valid, e = rule.weights(logits, temperature)
    keep = valid & (e >= min_p.float()[:, None]) if bool((min_p != 0).any()) else valid.clone()
    vocab = logits.shape[-1]
    rows = torch.nonzero((top_k > 0) & (top_k < vocab)).squeeze(1)
    if rows.numel():
        threshold = top_k_threshold(e[rows], keep[rows], top_k[rows])
        keep[rows] &= e[rows] >= threshold
    rows = torch.nonzero(top_p < 1).squeeze(1)
    if rows.numel():
        threshold = top_p_threshold(e[rows], keep[rows], top_p[rows])
        keep[rows] &= e[rows] >= threshold
    scale = (1.0 / rule.kept_mass(e, keep)).float()[:, None]
    out = torch.where(keep, e * scale, 0.0)
    rows = torch.nonzero(temperature == 0).squeeze(1)
    if rows.numel():
        out[rows] = rule.greedy_rows(logits[rows], valid[rows])
    bad = rule.out_of_range(temperature, top_k, top_p, min_p)
    if bool(bad.any()):
        out[bad] = 0.0
    return out
