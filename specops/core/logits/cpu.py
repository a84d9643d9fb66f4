"""The CPU backends' way of processing rows of logits: ``rule.processed_rows``'s rows, bit for
bit, with less work (tests/test_logits.py checks them against it).

On a CPU a question about the data costs no host synchronisation, so this path asks them:
  * each step runs on the rows that need it only (top-k where k is on, top-p where P < 1, the
    greedy rows where T == 0); every step is row-wise, so a subset of rows gets the same values;
  * top-k takes the k-th largest weight from the largest k of the rows (``largest_values``:
    ``torch.topk``, on long rows of the blocks that can hold them), not from a sort of the
    whole row: the same value;
  * top-p ranks only the kept weights when top-k or min-p left few (``torch.topk``), and bisects
    over a narrow range of those ranks: a float64 running sum of the sorted weights
    estimates every rank's kept mass W to far better than the float32 chunk sums' rounding, the
    range is the ranks whose estimate lies within a margin of the goal, and two exact masses check
    that the answer lies in it (a row where they do not, e.g. for a tie, bisects its whole range,
    as the reference does). W grows along the ranks, so the bisection ends where the
    reference's does;
  * a few rows (a single request's, say) are decided on the host (``few_rows``): each step is a
    threshold on the weights, so one threshold per row replaces the boolean masks, the exact
    masses are summed on the host from the chunk masses, and top-p ranks only the weights near
    its goal (a histogram of each row's mass by float32 bucket finds them, in one pass), or,
    on short rows, weighs every rank in one pass; at that size the fixed cost of each torch
    operation is most of the cost.
"""

from __future__ import annotations

import math
import struct
from array import array

import torch

from . import rule
from ..sampling.probs import as_float32
from ..sampling.race import chunk_mass_lists
from ..sampling.sums import exact_total_host

# A float32 sum of a chunk's 1024 weights lies within 1024 * 2**-24 (about 6e-5) of its exact
# value, relative; so does the exact mass of the chunk sums against the estimate. 2**-12 covers it.
_MARGIN = 2.0**-12


# Long rows rank their k largest values among blocks of BLOCK values, where k * BLOCK * SPARSE is
# at most V: a block reduction and two small ``torch.topk``s instead of one over the whole row.
BLOCK = 64
SPARSE = 8


def largest_values(rows: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest values of each of the rows (R, V), in descending order: ``torch.topk``'s.
    On long rows, from the k blocks of BLOCK values whose maxima are the largest (and the last
    partial block): each of the k largest values lies in one of them, or else these k blocks have
    k maxima at least as large."""
    count, vocab = rows.shape
    blocks = vocab // BLOCK
    if k * BLOCK * SPARSE > vocab:
        return rows.topk(k, dim=-1).values
    whole = rows[:, : blocks * BLOCK].reshape(count, blocks, BLOCK)
    chosen = whole.amax(dim=-1).topk(k, dim=-1).indices
    candidates = whole.gather(1, chosen[:, :, None].expand(count, k, BLOCK)).view(count, -1)
    if vocab % BLOCK:
        candidates = torch.cat([candidates, rows[:, blocks * BLOCK :]], dim=1)
    return candidates.topk(k, dim=-1).values


def top_p_threshold(e: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``rule.top_p_threshold`` for rows whose P < 1, with fewer exact masses."""
    ranked = torch.where(keep, e, -1.0)
    most = int(keep.sum(dim=-1).max())  # the ranks past it hold -1 and are never the answer
    if most < ranked.shape[-1] // 8:  # top-k or min-p left few: their ranks, not the whole row
        ranked = largest_values(ranked, max(most, 1))
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
    """``rule.top_k_threshold`` for rows whose k is in [1, V): the k-th largest kept weight."""
    k = top_k.long()
    largest = largest_values(torch.where(keep, e, -1.0), int(k.max()))
    return largest.gather(-1, (k - 1)[:, None])


def processed_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False
                   ) -> torch.Tensor:
    """``rule.processed_rows``: the same float32 rows (R, V)."""
    if logits.shape[0] <= FEW_ROWS:
        rows = few_rows(logits, temperature, top_k, top_p, min_p, min_p_last)
        if rows is not None:
            return rows
    valid, e, keep = kept_weights(logits, temperature, top_k, top_p, min_p, min_p_last)
    scale = (1.0 / rule.kept_mass(e, keep)).float()[:, None]
    out = torch.where(keep, e * scale, 0.0)
    rows = torch.nonzero(temperature == 0).squeeze(1)
    if rows.numel():
        out[rows] = rule.greedy_rows(logits[rows], valid[rows])
    bad = rule.out_of_range(temperature, top_k, top_p, min_p)
    if bool(bad.any()):
        out[bad] = 0.0
    return out


def processed_row_sets(sets: list[tuple], min_p_last: bool = False) -> list[torch.Tensor]:
    """``rule.each_processed``: the rows of each set (rows (R, V) and R values each). The rows of
    a single request's target and draft, few together, are processed in one pass of the host path
    (``few_rows``), which costs about as much as one set's at that size; exp2 still runs on each
    set's rows apart (``few_rows``' segments). Short rows only: on long ones the joined copy
    costs more than the operations it saves."""
    if len(sets) == 1:
        return [processed_rows(*sets[0], min_p_last=min_p_last)]
    counts = [rows.shape[0] for rows, *_ in sets]
    vocab = {rows.shape[1] for rows, *_ in sets}
    if sum(counts) <= FEW_ROWS and len(vocab) == 1 and min(vocab) < SHORT:
        joined = [torch.cat(parts) for parts in zip(*sets)]
        out = few_rows(*joined, min_p_last, segments=counts)
        if out is not None:
            return list(out.split(counts))
    return [processed_rows(*rows, min_p_last=min_p_last) for rows in sets]


def kept_weights(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False):
    """``rule.kept_weights``: the same (valid, e, keep), each step on the rows that need it."""
    valid, e = rule.weights(logits, temperature)
    any_min_p = bool((min_p != 0).any())
    keep = valid & (e >= min_p.float()[:, None]) if any_min_p and not min_p_last else \
        valid.clone()
    vocab = logits.shape[-1]
    rows = torch.nonzero((top_k > 0) & (top_k < vocab)).squeeze(1)
    if rows.numel():
        threshold = top_k_threshold(e[rows], keep[rows], top_k[rows])
        keep[rows] &= e[rows] >= threshold
    rows = torch.nonzero(top_p < 1).squeeze(1)
    if rows.numel():
        threshold = top_p_threshold(e[rows], keep[rows], top_p[rows])
        keep[rows] &= e[rows] >= threshold
    if any_min_p and min_p_last:
        keep &= e >= min_p.float()[:, None]
    return valid, e, keep


# ---------------------------------------------------------------------- a few rows, on the host

# Rows shorter than this cost more per torch operation than per value: fewer, larger operations
# serve them (one ``where`` for many thresholds; a target's and a draft's rows processed at once).
# Longer rows are better served apart (measured: docs/internals/performance.md).
SHORT = 2048
# Rows up to which ``few_rows`` serves a call: a single request's N + 1 rows for N up to 15.
FEW_ROWS = 16
# The ranks top-p reads first on the host; more (8 times as many) only when these hold too little.
FIRST_RANKS = 256
# Top-p's exact masses taken in one pass over the rows, per row.
CANDIDATES = 8
# Rows (R, V) with R * V * V up to this take every rank's exact mass in one pass: a row of one
# chunk, few enough values to weigh each rank at once (V = 16 and 32 for a single request).
EVERY_RANK = 2**15
# Top-p's histogram of a row's mass: a weight's bucket is the top 13 bits of its float32 bits
# (sign, exponent, 4 bits of mantissa), 16 buckets an octave, ordered as the weights (>= 0) are;
# every finite float32 >= 0 falls below BUCKETS.
BUCKET_SHIFT = 19
BUCKETS = 4096


def host_masses(kept: torch.Tensor) -> list[float]:
    """``rule.kept_mass`` of rows (R', V) whose dropped weights are 0 already: R' float64 values,
    the chunk masses summed exactly on the host; nan where a chunk mass is not finite (the
    float64 sum of float32 masses overflows never, and is finite only when they all are)."""
    return [exact_total_host(row) if math.isfinite(sum(row)) else math.nan
            for row in chunk_mass_lists(kept)]


def below(t: float) -> float:
    """The float32 value just below t > 0: for float32 weights, e >= t exactly when e > below(t)."""
    bits = struct.unpack("I", struct.pack("f", t))[0]
    return struct.unpack("f", struct.pack("I", bits - 1))[0]


def kept_rows(e: torch.Tensor, thresholds: list[list[float]], in_place: bool = False
              ) -> torch.Tensor:
    """Row r of e with the weights below t zeroed, for every t in thresholds[r] (each list of one
    length): (sum of the lengths, V), the rows of ``torch.where(e >= t, e, 0.0)``. Long rows go
    through ``torch.threshold`` row by row (e > below(t)), many times faster than ``where``
    there; short ones through one ``where``, fewer operations. ``in_place`` lets long rows be
    thresholded in e itself (one threshold per row): at V = 32000 a new tensor's pages cost as
    much as the pass."""
    width = len(thresholds[0])
    if width == 1 and all(ts[0] <= 0 for ts in thresholds):  # every weight is kept
        return e
    if e.shape[-1] < SHORT:
        t = float32_tensor([t for ts in thresholds for t in ts]).view(len(thresholds), -1, 1)
        rows = e[:, None, :]
        return torch.where(rows >= t, rows, 0.0).view(-1, e.shape[-1])
    if in_place and width == 1:
        for r, (t,) in enumerate(thresholds):
            if t > 0:  # t <= 0 keeps every weight (every weight is >= 0)
                torch.threshold_(e[r], below(t), 0.0)
        return e
    out = e.new_empty(e.shape[0] * width, e.shape[-1])
    for r, ts in enumerate(thresholds):
        for i, t in enumerate(ts):
            if t > 0:
                torch.threshold(e[r], below(t), 0.0, out=out[r * width + i])
            else:  # every weight is kept (every weight is >= 0)
                out[r * width + i] = e[r]
    return out


def masses_at(e: torch.Tensor, thresholds: list[list[float]]) -> list[list[float]]:
    """W(t) = the exact mass of the weights e >= t of row r, for every t in thresholds[r]: one
    pass over the rows for all of them (each row's threshold list padded with its last one)."""
    width = max(len(ts) for ts in thresholds)
    if width == 1 and all(ts[0] <= 0 for ts in thresholds):  # every weight is kept
        return [[w] for w in host_masses(e)]
    padded = [ts + ts[-1:] * (width - len(ts)) for ts in thresholds]
    totals = host_masses(kept_rows(e, padded))
    return [totals[r * width : r * width + len(ts)] for r, ts in enumerate(thresholds)]


def near_the_goal(kept: torch.Tensor, goals: list[float], total: list[float]
                  ) -> list[tuple[float, list[float]]] | None:
    """For each row of the kept weights (R, V) (the dropped ones 0): (above, values), values the
    kept weights of the histogram buckets where the float64 running sum of the weights in
    descending order may reach the goal within the margin, in descending order, and above the
    float64 mass of the weights larger than all of them (short of the goal by more than the
    margin); None where a row's window reaches bucket 0 (the zero weights, and subnormals below
    2^-130). One pass over the rows (a histogram of their masses by bucket) and a selection: no
    ranking of the whole row."""
    rows, vocab = kept.shape
    offsets = torch.arange(0, rows * BUCKETS, BUCKETS, dtype=torch.int32)[:, None]
    buckets = (kept.view(torch.int32) >> BUCKET_SHIFT).add_(offsets)
    masses = torch.bincount(buckets.view(-1), weights=kept.view(-1).double(),
                            minlength=rows * BUCKETS).view(rows, BUCKETS)
    reached = masses.flip(-1).cumsum(-1)  # [r, j]: the mass of buckets BUCKETS - 1 - j and up
    margins = [_MARGIN * w for w in total]
    ends = torch.tensor([[g - m, g + m] for g, m in zip(goals, margins)], dtype=torch.float64)
    first, last = torch.searchsorted(reached, ends).unbind(-1)
    if bool((last >= BUCKETS - 1).any()):  # the window reaches bucket 0, or passes it
        return None
    top, bottom = (BUCKETS - 1 - first)[:, None] + offsets, (BUCKETS - 1 - last)[:, None] + offsets
    # As a rule the window is one bucket: one comparison instead of two (each costs a pass).
    inside = (buckets == top) if bool((first == last).all()) else \
        (buckets >= bottom) & (buckets <= top)
    values = kept[inside].split(inside.sum(dim=-1).tolist())
    above = torch.where(first > 0, reached.gather(-1, (first - 1).clamp(min=0)[:, None])[:, 0],
                        0.0).tolist()
    return [(a, v.sort(descending=True).values.tolist()) for a, v in zip(above, values)]


def top_p_thresholds(kept: torch.Tensor, total: list[float], top_p: list[float],
                     largest: list[list[float]] | None = None
                     ) -> list[tuple[float, float]] | None:
    """For each row r of the kept weights (R, V) (the dropped ones 0): (t, W(t)), t the largest
    kept weight whose kept mass W(t) (the kept weights >= t) is at least top_p[r] * total[r]
    (total: the row's kept mass), as ``rule.top_p_threshold`` finds it; None when some row needs
    the general path. ``largest``: each row's largest kept weights in descending order, where
    top-k has ranked them already.

    The weights where the goal may be reached are ranked (``largest``, else ``near_the_goal``;
    where neither serves, the largest weights by ``torch.topk``, more of them while their float64
    running sum stays below the goal plus a margin); the rank where that sum first reaches the
    goal is the likely answer: exact masses check it and the weight just above it (one pass, as a
    rule), and otherwise decide, in passes of up to CANDIDATES ranks per row, between the last
    rank known short of the goal (at first the weights above the ranked ones: short by more than
    the margin, which exceeds the running sum's error) and the first known to reach it (the
    margin's end, checked)."""
    rows, vocab = kept.shape
    goals = [p * w for p, w in zip(top_p, total)]
    near = ([(0.0, values) for values in largest] if largest is not None else
            near_the_goal(kept, goals, total) if vocab > FIRST_RANKS else None)
    ranks = 0  # how many torch.topk ranked
    while True:
        if near is None:
            ranks = min(ranks * 8 or FIRST_RANKS, vocab)
            near = [(0.0, values) for values in largest_values(kept, ranks).tolist()]
        ranked = [values for _, values in near]
        guesses, high = [], []
        for (running, values), goal, w in zip(near, goals, total):
            guess = hi = None
            for i, v in enumerate(values):
                running += v
                if guess is None and running >= goal:
                    guess = i
                if running >= goal + _MARGIN * w:
                    hi = i
                    break
            if hi is None and len(values) == vocab:  # ranks past the kept ones hold 0: W(0)
                hi = vocab - 1
            guesses.append(hi if guess is None else guess)
            high.append(hi)
        if all(hi is not None for hi in high):
            break
        if ranks == vocab:
            return None
        near = None

    def first_of_tie(r: int, i: int) -> int:  # equal weights have equal W: search by weight
        while i > 0 and ranked[r][i - 1] == ranked[r][i]:
            i -= 1
        return i

    # W grows along the ranks: find the first rank with W >= goal, knowing low (short of it, or
    # -1) and high (reaching it); done when high's tie begins right after low.
    low = [-1] * rows
    seen: list[dict] = [{} for _ in range(rows)]  # rank -> W, per row
    probes = [sorted({first_of_tie(r, g) - 1, g, hi} - {-1}) for r, (g, hi) in
              enumerate(zip(guesses, high))]
    while True:
        masses = masses_at(kept, [[ranked[r][i] for i in ranks] for r, ranks in enumerate(probes)])
        for r, ranks in enumerate(probes):
            seen[r].update(zip(ranks, masses[r]))
            if seen[r][high[r]] < goals[r]:  # the margin's end must reach the goal
                return None
            for i in ranks:
                if seen[r][i] >= goals[r]:
                    high[r] = min(high[r], i)
                else:
                    low[r] = max(low[r], i)
        if all(first_of_tie(r, high[r]) - 1 <= low[r] for r in range(rows)):
            return [(ranked[r][high[r]], seen[r][high[r]]) for r in range(rows)]
        probes = []
        for r in range(rows):
            lo, hi = low[r], first_of_tie(r, high[r])
            step = max(1, -(-(hi - lo - 1) // CANDIDATES))
            probes.append(list(range(lo + 1, hi, step)) or [high[r]])


def each_once(function, values: list[float]) -> list[float]:
    """function of each value, computed once per distinct value (a single request's rows share
    their parameters)."""
    once = {value: function(value) for value in set(values)}
    return [once[value] for value in values]


def per_row(values: list[float]):
    """Float32 values, one per row, as a factor of (R, V) rows: one Python number when all are
    equal (a single request's: a float32 multiply by it gives the tensor's products, with no
    tensor to build), else an (R, 1) tensor."""
    if all(v == values[0] for v in values):
        return values[0]
    return float32_tensor(values)[:, None]


def float32_tensor(values: list[float]) -> torch.Tensor:
    """Float32 values as a 1-D tensor: through an array, a few times faster than from a list."""
    return torch.frombuffer(array("f", values), dtype=torch.float32)


def few_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
             top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False,
             segments: list[int] | None = None) -> torch.Tensor | None:
    """``rule.processed_rows`` for a few rows, decided on the host; None when some row needs
    the general path (parameters out of range, a row without mass, a weight that is not a
    number). ``segments``: where the rows join sets the rule processes as tensors of their own,
    their row counts: torch's CPU exp2 rounds a tensor's vectorised body and its scalar tail
    apart, so each set's weights are taken on its own rows (a set with a bad logit: None).

    Each step keeps the weights at or above a threshold: min-p at M, top-k at its k-th largest
    weight (the k-th largest of all weights lies below M exactly when fewer than k pass M), top-p
    at its answer among what those keep; so the rows keep e >= max of the three, and a row's
    dropped weights are 0 in every mass it needs. With ``min_p_last`` min-p's threshold comes
    after top-p's answer, and the kept mass is taken again.
    """
    rows, vocab = logits.shape
    t, k, p, m = (v.tolist() for v in (temperature, top_k, top_p, min_p))
    if not all(a >= 0 and b >= 0 and 0 < c <= 1 and 0 <= d <= 1 for a, b, c, d in zip(t, k, p, m)):
        return None  # out of range (``rule.out_of_range``; NaN fails every comparison)
    t32 = each_once(as_float32, t)
    if any(value and not value32 for value, value32 in zip(t, t32)):
        return None  # a temperature that rounds to float32's 0: the rule's own arithmetic decides
    x = logits.float().contiguous()  # in row-major order, as ``rule.weights`` reads them
    greedy = [value == 0 for value in t]
    peak = x.amax(dim=-1, keepdim=True)
    # Its float32 c = LOG2E / T: the float64 quotient of two float32 values rounds to float32's
    # correctly rounded one (53 bits are more than 2 * 24 + 2).
    c = each_once(lambda value: min(as_float32(rule.LOG2E / value), rule.FLOAT32_MAX)
                  if value else 1.0, t32)
    # Every row's largest logit finite: no NaN or +inf, and every -inf logit (a mask) weighs
    # exp2(-inf * c) = 0 and is never the largest, as the rule's invalid logits, where c > 0 (T =
    # +inf makes it 0; a sum of the peaks past float32's range only takes the masks' way).
    valid = None if math.isfinite(peak.sum().item()) and all(c) else torch.isfinite(x)
    if all(greedy) and valid is None:  # ``rule.greedy_rows``
        return one_hot_at_largest(x)
    if valid is None:  # ``rule.weights``
        e = torch.sub(x, peak).mul_(per_row(c))  # in place: fewer new pages
        for part in e.split(segments) if segments else (e,):
            part.exp2_()
    elif segments:
        return None
    else:  # invalid logits weigh 0, below every threshold above 0 and adding nothing to a mass
        valid, e = rule.weights(logits, temperature)

    # min-p (0: every weight passes), unless it comes last
    m32 = each_once(as_float32, m)
    floor = [0.0] * rows if min_p_last else m32
    ks = [value if 0 < value < vocab and not g else 0 for value, g in zip(k, greedy)]
    nucleus = [r for r in range(rows) if p[r] < 1 and not greedy[r]]
    if valid is None and nucleus and rows * vocab * vocab <= EVERY_RANK:
        out = short_rows(e, floor, ks, [float(value) for value in p], greedy,
                         m32 if min_p_last else None)
        return None if out is None else with_greedy_rows(out, greedy, x, logits, valid)
    if any(ks):
        largest = largest_values(e, max(ks)).tolist()
        floor = [max(f, largest[r][value - 1]) if value else f
                 for r, (f, value) in enumerate(zip(floor, ks))]
    kept = kept_rows(e, [[f] for f in floor], in_place=True)  # e is this call's own
    total = host_masses(kept)
    if not all(w > 0 for w, g in zip(total, greedy) if not g):  # nan or no mass: general path
        return None
    if nucleus:
        # Where top-k ranked every row, its largest weights are the kept ones' first ranks.
        ranked = ([[v for v in largest[r][:ks[r]] if v >= floor[r]] for r in nucleus]
                  if all(ks[r] for r in nucleus) else None)
        answers = top_p_thresholds(kept if len(nucleus) == rows else kept[nucleus],
                                   [total[r] for r in nucleus], [float(p[r]) for r in nucleus],
                                   ranked)
        if answers is None:
            return None
        raised = [0.0] * rows  # 0: the row keeps what it kept
        for r, (threshold, mass) in zip(nucleus, answers):
            raised[r], total[r] = threshold, mass
        kept = kept_rows(kept, [[f] for f in raised], in_place=True)
    if min_p_last and any(m):  # min-p among what top-k and top-p kept; the top weight, 1, stays
        kept = kept_rows(kept, [[value] for value in m32], in_place=True)
        total = host_masses(kept)
    out = kept.mul_(per_row([as_float32(1.0 / w) if not g else 1.0
                             for w, g in zip(total, greedy)]))
    return with_greedy_rows(out, greedy, x, logits, valid)


def with_greedy_rows(out: torch.Tensor, greedy: list[bool], x: torch.Tensor,
                     logits: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """``few_rows``' rows ``out`` with the greedy ones (T == 0) made one-hot, in place; x: the
    float32 logits, valid: where they are valid (None: each row's largest is finite, and
    its -inf logits count as the rule's invalid ones)."""
    if any(greedy):
        which = torch.tensor(greedy)
        out[which] = (one_hot_at_largest(x[which]) if valid is None else
                      rule.greedy_rows(logits[which], valid[which]))
    return out


def short_rows(e: torch.Tensor, floor: list[float], ks: list[int], top_p: list[float],
               greedy: list[bool], last_min_p: list[float] | None) -> torch.Tensor | None:
    """``few_rows``' steps 4-7 on short rows of weights e (R, V) (-inf logits weigh 0),
    R * V * V <= EVERY_RANK (one chunk, whose float32 sum is its exact mass): every row kept at
    every threshold in one pass, each token's weight raised to the row's floor, a table
    (R, V, V) whose sums are the kept mass at every threshold; top-p's answer and every
    normaliser are read from them, and each row's kept weights are one row of the table.
    ``floor``: each row's min-p threshold (0 where it comes last: ``last_min_p`` then holds
    them); ``ks``: k where top-k is on, else 0. None where a row has no mass (the general path
    decides it). Greedy rows get any values: the caller replaces them."""
    rows, vocab = e.shape
    values = e.tolist()
    ranks = [sorted(range(vocab), key=row.__getitem__, reverse=True) for row in values]
    floor = [max(f, row[rank[k - 1]]) if k else f
             for f, row, rank, k in zip(floor, values, ranks, ks)]
    # table[r, j]: row r kept at t_j = max(e[r, j], floor[r]), the weights >= t_j; its sum is
    # W(t_j), the mass of the weights >= t_j among those min-p and top-k keep.
    weights = e[:, None, :]
    table = torch.where(weights >= e.clamp(min=per_row(floor))[:, :, None], weights, 0.0)
    masses = table.sum(-1).tolist()
    chosen, scales = [], []
    for r, (row, rank, mass) in enumerate(zip(values, ranks, masses)):
        # The least weight's row keeps every weight >= floor: W(floor), the row's kept mass.
        t, j = floor[r], rank[-1]
        if not greedy[r]:
            if not mass[j] > 0:
                return None
            if top_p[r] < 1:  # the largest kept weight whose W reaches P * W(floor)
                goal = top_p[r] * mass[j]
                j = next(j for j in rank if row[j] >= t and mass[j] >= goal)
                t = row[j]
            if last_min_p is not None and last_min_p[r] > t:  # min-p among what they keep
                j = min((j for j in rank if row[j] >= last_min_p[r]), key=row.__getitem__)
        chosen.append(r * vocab + j)
        scales.append(as_float32(1.0 / mass[j]) if mass[j] > 0 else 1.0)
    index = torch.frombuffer(array("q", chosen), dtype=torch.int64)
    return table.view(rows * vocab, vocab).index_select(0, index).mul_(per_row(scales))


def one_hot_at_largest(x: torch.Tensor) -> torch.Tensor:
    """``rule.greedy_rows`` of float32 rows (R, V) whose largest logit is finite (-inf ones
    may be among them). On long rows ``max`` gives the first of equal maxima as ``argmax`` does,
    at a third of its cost on CPU rows (on short ones its second output costs more than it
    saves)."""
    rows, vocab = x.shape
    top = x.argmax(dim=-1) if vocab < SHORT else x.max(dim=-1).indices
    return torch.zeros_like(x).index_put_((torch.arange(rows), top),
                                          torch.ones((), dtype=torch.float32))
