"""The from-logits rule (core/logits/rule.py) on vocabulary shards: every row's peak, greedy token,
top-k and top-p thresholds and kept mass found over all ranks with collectives of O(rows)
elements, so that each rank's processed columns are the single-device ones.

Thresholds are searched on the float32 bit pattern: the weights e lie in [0, 1], whose bit
patterns, read as int32, are in value order and below 2**30. The search finds the largest
pattern b with count(e >= b) >= k (top-k), or W(e >= b) >= P * W(0) (top-p): exactly the k-th
largest kept weight, or the single-device top-p threshold, since counts and masses change only at
kept weights. Top-k settles 4 bits a round (8 rounds, each one all_reduce of a 16-bucket count
histogram per row: counts add up by bucket). Top-p bisects (30 rounds, each one all_reduce of
exact mass bins per row): a mass is the exact sum of float32 chunk masses of the kept weights,
and a chunk's float32 sum is not the sum of its buckets' sums, so every candidate threshold costs
a pass over the row of its own, and one a round is the fewest passes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.logits import rule as params
from ..core.logits.rule import Step, per_row
from ..core.logprobs.rule import LN2
from ..core.logprobs.tokens import GREEDY, NO_MASS, SAMPLED, RowFacts, at_tokens
from .comm import all_gather, all_reduce
from .shards import Shard, exact_totals, piece_masses

BISECTION_ROUNDS = 30  # bit patterns of [0, 1] lie below 2**30
RADIX_BITS = 4  # top-k: bits settled per round, so ceil(30 / 4) = 8 rounds
SEARCH_TOP_K = 1  # bit 0 of the layout's ``searches``
SEARCH_TOP_P = 2  # bit 1


def kept_totals(shard: Shard, e: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """float64 (R,): the exact kept mass of each row over every rank (one all_reduce)."""
    return exact_totals(shard, piece_masses(shard, torch.where(keep, e, 0.0)))


def bisect(e: torch.Tensor, enough) -> torch.Tensor:
    """Top-p's search: the largest int32 pattern b in [0, 2**30) for which enough(e >= b)
    holds, as its float32 value (R, 1); ``enough`` maps the (R, width) mask of the weights at or
    above b to (R,) bool, holds at b = 0 and, once false, stays false above (0.0 where it holds
    nowhere else)."""
    bits = e.view(torch.int32)
    lo = torch.zeros(e.shape[0], dtype=torch.int64, device=e.device)
    hi = lo + 2**BISECTION_ROUNDS
    for _ in range(BISECTION_ROUNDS):
        mid = (lo + hi) // 2
        ok = enough(bits >= mid[:, None])
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    return lo.to(torch.int32).view(torch.float32)[:, None]


def top_k_threshold(shard: Shard, e, keep, top_k) -> torch.Tensor:
    """core/logits/rule.top_k_threshold over every rank's columns: (R, 1); -1 (keep all) where k is
    0 or at least V. With fewer than k kept the search ends at 0.0, which also keeps all.

    Each round splits the patterns [lo, lo + width) into 16 buckets of ``step``; the kept
    weights' histogram over them (below lo: bucket 0, at or above lo + width: the last), summed
    over the ranks, gives count(e >= lo + m * step) for every m, and lo moves to the last
    candidate with at least k."""
    k = top_k.long()[:, None]
    bits = e.view(torch.int32).long()
    lo = torch.zeros(e.shape[0], dtype=torch.int64, device=e.device)
    width = 2**BISECTION_ROUNDS
    while width > 1:  # the same rounds on every rank: they depend on constants alone
        step = max(width >> RADIX_BITS, 1)
        buckets = width // step
        bucket = ((bits - lo[:, None]) // step).clamp(0, buckets - 1)
        histogram = torch.zeros(bits.shape[0], buckets, dtype=torch.int64, device=e.device)
        histogram.scatter_add_(1, bucket, keep.long())
        at_least = histogram.flip(-1).cumsum(-1).flip(-1)[:, 1:]  # count(e >= lo + m step)
        at_least = all_reduce(at_least, dist.ReduceOp.SUM, shard.group)
        lo = lo + step * (at_least >= k).sum(dim=-1)
        width = step
    threshold = lo.to(torch.int32).view(torch.float32)[:, None]
    return torch.where((k > 0) & (k < shard.vocab), threshold, -1.0)


def top_p_threshold(shard: Shard, e, keep, top_p) -> torch.Tensor:
    """core/logits/rule.top_p_threshold over every rank's columns: (R, 1); -1 where P >= 1."""
    goal = top_p.double() * kept_totals(shard, e, keep)
    threshold = bisect(e, lambda above: kept_totals(shard, e, keep & above) >= goal)
    return torch.where((top_p < 1)[:, None], threshold, -1.0)


def peaks(shard: Shard, x: torch.Tensor, valid: torch.Tensor):
    """Each row's largest valid logit over every rank (R, 1) float32 (-inf where none) and the
    lowest global id holding it (R,) int64 (the greedy token), by one all_gather."""
    masked = torch.where(valid, x, -torch.inf)
    peak = masked.amax(dim=-1)
    columns = torch.arange(shard.width, device=x.device) + shard.start
    first = torch.where(valid & (masked == peak[:, None]), columns, shard.vocab).amin(dim=-1)
    every = all_gather(torch.stack([peak.double(), first.double()], dim=-1), shard.group)
    best = every[..., 0].amax(dim=0)
    argmax = torch.where(every[..., 0] == best, every[..., 1], torch.inf).amin(dim=0)
    return best.float()[:, None], torch.where(torch.isfinite(best), argmax, -1.0).long()


def kept_shard(shard: Shard, logits: torch.Tensor, temperature, top_k, top_p, min_p,
               searches: int, min_p_last: bool = False):
    """core/logits/rule.kept_weights of the (R, width) shards of R rows, over every rank: (x
    float32, valid, the rows' peaks (R, 1), greedy ids (R,), weights e, kept tokens).
    ``searches`` says which threshold searches run (decided from the arguments' kinds, the same
    on every rank, so that every rank makes the same collectives); ``min_p_last``: min-p after
    top-k and top-p (transformers' order)."""
    x = logits.float()
    valid = torch.isfinite(x)
    peak, argmax = peaks(shard, x, valid)
    valid, e = params.weights(x, temperature, peak)  # x - m finite, m the rows' peak
    at_least_min_p = e >= min_p.float()[:, None]
    keep = valid if min_p_last else valid & at_least_min_p
    if searches & SEARCH_TOP_K:
        keep = keep & (e >= top_k_threshold(shard, e, keep, top_k))
    if searches & SEARCH_TOP_P:
        keep = keep & (e >= top_p_threshold(shard, e, keep, top_p))
    if min_p_last:
        keep = keep & at_least_min_p
    return x, valid, peak, argmax, e, keep


def processed_shard(shard: Shard, logits: torch.Tensor, temperature, top_k, top_p, min_p,
                    searches: int, min_p_last: bool = False) -> torch.Tensor:
    """core/logits/rule.processed_rows of the (R, width) shards of R rows: float32 (R, width)
    (``kept_shard``'s arguments)."""
    x, valid, peak, argmax, e, keep = kept_shard(shard, logits, temperature, top_k, top_p, min_p,
                                                 searches, min_p_last)
    columns = torch.arange(shard.width, device=x.device) + shard.start
    greedy = (columns == argmax[:, None]).float()
    return params.finished_rows(e, keep, kept_totals(shard, e, keep), greedy, temperature, top_k,
                                top_p, min_p)


def shard_logprobs(shard: Shard, logits: torch.Tensor, token_ids: torch.Tensor, temperature,
                   top_k, top_p, min_p, searches: int, min_p_last: bool, num_top: int):
    """core/logprobs' token logprobs over every rank, for rows (R, width) and their global token
    ids (R,): the rank holding a token computes its value, every other -inf, and a MAX all_reduce
    gives it to all; each rank's num_top most likely tokens are all-gathered and the best kept.
    Returns (logprobs (R,), top ids (R, num_top) int32, top logprobs (R, num_top))."""
    x, valid, peak, argmax, e, keep = kept_shard(shard, logits, temperature, top_k, top_p, min_p,
                                                 searches, min_p_last)
    mode = torch.where(temperature == 0, GREEDY, SAMPLED)
    mode = torch.where(params.out_of_range(temperature, top_k, top_p, min_p) | (argmax < 0),
                       NO_MASS, mode)[:, None]
    local_argmax = (argmax - shard.start)[:, None]
    facts = RowFacts(mode, peak, params.coefficient(temperature)[:, None],
                     kept_totals(shard, e, keep).log()[:, None], local_argmax)

    def kept(ids, _):
        return keep.gather(1, ids)

    def logprobs_at(local):  # (R, K) ids of this shard's columns, -1: another's
        return at_tokens(x.gather(1, local.clamp(0, shard.width - 1)), facts, local, shard.width,
                         kept)

    ids = token_ids.long()
    local = torch.where((ids >= shard.start) & (ids < shard.start + shard.width),
                        ids - shard.start, -1)[:, None]
    logprobs = all_reduce(logprobs_at(local)[:, 0], dist.ReduceOp.MAX, shard.group)
    if num_top == 0:  # the same on every rank (the layout agrees on it): no gather
        empty = torch.zeros(x.shape[0], 0, device=x.device)
        return logprobs, empty.int(), empty
    fewer = min(num_top, shard.width)
    candidates = torch.where(keep, x, -torch.inf).topk(fewer, dim=-1).indices
    owns_greedy = (mode == GREEDY) & (local_argmax >= 0) & (local_argmax < shard.width)
    first = torch.arange(fewer, device=x.device) == 0
    candidates = torch.where(owns_greedy & first, local_argmax.clamp(0, shard.width - 1),
                             candidates)
    pad = (0, num_top - fewer)
    # A greedy row's one token with probability is its argmax: a later slot holding it again (a
    # tied peak) would name it twice.
    values = torch.where(owns_greedy & ~first, -torch.inf, logprobs_at(candidates))
    values = torch.nn.functional.pad(values, pad, value=-torch.inf)
    global_ids = torch.nn.functional.pad(candidates + shard.start, pad, value=-1)
    # The best are the largest logits among the tokens with probability (equal logprobs of
    # unequal logits, at T = +inf, ranked by the logits as on one device).
    ranked = torch.nn.functional.pad(x.gather(1, candidates), pad, value=-torch.inf)
    ranked = torch.where(values > -torch.inf, ranked, -torch.inf)
    every = all_gather(torch.stack([values.double(), global_ids.double(), ranked.double()]),
                       shard.group)
    values, global_ids, ranked = (every[:, i].permute(1, 0, 2).flatten(1) for i in range(3))
    best = ranked.topk(num_top, dim=-1).indices  # (R, world * num_top): every candidate
    top_ids, top_values = global_ids.gather(1, best).long(), values.gather(1, best)
    has = (top_values > -torch.inf) & (ids >= 0)[:, None] & (ids < shard.vocab)[:, None]
    return (logprobs, torch.where(has, top_ids, -1).int(),
            torch.where(has, top_values, -torch.inf).float())


def shard_entropy(shard: Shard, logits: torch.Tensor, temperature, top_k, top_p, min_p,
                  searches: int, min_p_last: bool = False) -> torch.Tensor:
    """core/logprobs' row entropies over every rank, of rows (R, width): float32 (R,), H =
    ln W - ln 2 * sum (e / W) t over the kept tokens (t = (x - m) c, the base-2 log of the weight),
    each rank's share of the sum all-reduced; 0 for a greedy row and a row without mass."""
    x, valid, peak, argmax, e, keep = kept_shard(shard, logits, temperature, top_k, top_p, min_p,
                                                 searches, min_p_last)
    mass = kept_totals(shard, e, keep)
    t = (x - peak) * params.coefficient(temperature)[:, None]
    weighted = torch.where(keep & (e > 0), e.double() * t.double(), 0.0).sum(dim=-1)
    weighted = all_reduce(weighted, dist.ReduceOp.SUM, shard.group)
    entropy = mass.log() - LN2 * weighted / mass
    sampled = (temperature > 0) & ~params.out_of_range(temperature, top_k, top_p, min_p) & \
        (argmax >= 0)
    return torch.where(sampled, entropy, 0.0).float()


def adjusted_shard(shard: Shard, logits: torch.Tensor, step: Step, draft_token_ids
                   ) -> torch.Tensor:
    """Rule step 0 on a shard of the target's rows (B, N + 1, width): its bias, counts and prompt
    mask are this shard's columns (B, width), the grammar mask the whole vocabulary's; a draft
    counts as generated in the shard holding its id."""
    if not step.changes_logits():
        return logits
    bitmask = step.allowed_token_bitmask
    if bitmask is not None:  # this shard's columns of the mask: 0, or -inf where not allowed
        logits = logits.float() + params.blocked(bitmask, shard.start + shard.width)[
            ..., shard.start:]

    def generated(counts):  # drafts of other shards counted in a spare column, then dropped
        ids = draft_token_ids.long()
        local = torch.where((ids >= shard.start) & (ids < shard.start + shard.width),
                            ids - shard.start, shard.width)
        local = torch.where((ids >= 0) & (ids < shard.vocab), local, -1)  # -1 ends the drafts
        spare = torch.nn.functional.pad(counts, (0, 1))
        return params.chain_generated(spare, local)[..., :shard.width]

    return step._replace(allowed_token_bitmask=None).adjusted(logits, generated)


def processed_inputs(shard: Shard, draft_probs, target_logits, draft_logits, temperature, top_k,
                     top_p, min_p, searches: int, draft_parameters=(None,) * 4,
                     step: Step = Step(), draft_token_ids=None, min_p_last: bool = False):
    """chain/from_logits.processed_inputs on shards: (draft_probs, target_probs), the target's
    rows after rule step 0 (``adjusted_shard``), the draft's logits by the draft's own parameters
    (each None: the target's); the target's and the draft's rows are processed together, so each
    search is one collective for both."""
    target_logits = adjusted_shard(shard, target_logits, step, draft_token_ids)
    blocks = [target_logits] + ([draft_logits] if draft_logits is not None else [])
    flat = [block.reshape(-1, shard.width) for block in blocks]
    target_parameters = (temperature, top_k, top_p, min_p)
    per_block = [target_parameters, params.drafts_own(draft_parameters, target_parameters)]

    def parameter(index):
        return torch.cat([per_row(values[index], block.shape[0], block.shape[1])
                          for values, block in zip(per_block, blocks)])

    rows = processed_shard(shard, torch.cat([f.float() for f in flat]), *map(parameter, range(4)),
                           searches, min_p_last)
    target_probs = rows[: flat[0].shape[0]].reshape(target_logits.shape)
    if draft_logits is not None:
        draft_probs = rows[flat[0].shape[0]:].reshape(draft_logits.shape)
    return draft_probs, target_probs
