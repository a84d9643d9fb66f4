"""Rows of logits turned into the distributions each request's sampling parameters ask for: the
plain reference of the rule every sampler that takes logits applies (docs/semantics.md,
"Verification from logits"), in vLLM's sampler order, row by row.

For a row of logits x (read as float32) and its request's temperature T, top-k k, top-p P and
min-p M (T, P and M read as float32 too: ``per_row``):

0. Where given (``adjusted_logits``), the row's grammar mask and its request's logit bias: a token
   the mask does not allow gets -inf, every other x + bias (float32); then its penalties
   (``penalized``), the drafts before the row counted as generated; then the steps below.
1. A logit that is NaN or infinite counts as -inf: it is never kept; so does a finite one so
   far below the row's largest that x - max(x) rounds to -inf in float32.
2. T == 0: the row is greedy, one-hot at its largest logit (the lowest index on ties).
3. T > 0: the weights e = exp2((x - max(x)) * c), c = log2(e) / T (at most float32's largest
   value), all float32: the softmax of x / T before normalising, 1 at the largest logit.
4. min-p: keep the tokens with e >= M (p >= M * max(p)); M == 0 keeps all. (Hugging Face
   transformers' order, ``min_p_last``: this step after step 6.)
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
from typing import NamedTuple

import torch

from ..sampling.race import chunk_masses
from ..sampling.sums import exact_total

LOG2E = float(torch.tensor(1 / math.log(2), dtype=torch.float32))  # log2(e), as float32
FLOAT32_MAX = torch.finfo(torch.float32).max


def weights(logits: torch.Tensor, temperature: torch.Tensor, peak: torch.Tensor | None = None):
    """Steps 1 and 3 for rows (R, V) and their temperatures (R,): (valid logits (R, V) bool,
    float32 weights e (R, V), 0 where invalid; rows without a valid logit have none).

    peak: each row's largest valid logit (R, 1) float32, given when the rows are shards of longer
    rows (a vocabulary shard); by default the rows' own. The rows are read in row-major order
    whatever their layout: on a CPU, exp2 and sums round by the order of memory."""
    x = logits.float().contiguous()
    if peak is None:
        peak = torch.where(torch.isfinite(x), x, -torch.inf).amax(dim=-1, keepdim=True)
    # Valid: x - m finite. A finite logit so far below m that x - m rounds to -inf is invalid as
    # well (at T = +inf, c = 0, its weight would be -inf * 0 = NaN; a GPU never keeps it).
    n = x - peak
    valid = torch.isfinite(n)
    e = torch.where(valid, torch.exp2(n * coefficient(temperature)[:, None]), 0.0)
    return valid, e


def coefficient(temperature: torch.Tensor) -> torch.Tensor:
    """c = LOG2E / T, float32, one correctly rounded division per value (the weights are
    exp2((x - m) c)), at most float32's largest value: a T so small (below LOG2E / that value,
    about 4.2e-39) that the quotient passes float32's range keeps every weight a number, 1 at the
    largest logit and about 0 elsewhere. A tensor divides a tensor: a Python number over a tensor
    is the tensor's reciprocal times the number, rounded twice."""
    t = temperature.float()
    return (torch.full_like(t, LOG2E) / t).clamp_(max=FLOAT32_MAX)


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
                   top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False
                   ) -> torch.Tensor:
    """The float32 distributions (R, V) of rows of logits (R, V) under each row's parameters
    (R,) (temperature, top_p, min_p float; top_k int): steps 1-7 above. ``min_p_last``: step 4
    after step 6, Hugging Face transformers' order (its top-k and top-p then choose among all
    tokens, and min-p among what they keep)."""
    valid, e, keep = kept_weights(logits, temperature, top_k, top_p, min_p, min_p_last)
    return finished_rows(e, keep, kept_mass(e, keep), greedy_rows(logits, valid), temperature,
                         top_k, top_p, min_p)


def kept_weights(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, min_p_last: bool = False):
    """Steps 1 and 3-6 for rows (R, V): (valid logits, float32 weights e, the kept tokens), each
    (R, V)."""
    valid, e = weights(logits, temperature)
    at_least_min_p = e >= min_p.float()[:, None]
    keep = valid if min_p_last else valid & at_least_min_p
    keep = keep & (e >= top_k_threshold(e, keep, top_k))
    keep &= e >= top_p_threshold(e, keep, top_p)
    if min_p_last:
        keep &= at_least_min_p
    return valid, e, keep


def finished_rows(e, keep, mass, greedy, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """Step 7 from the kept weights and their exact mass (R,) float64, then the greedy rows
    (T == 0) and the rows without mass (parameters out of range)."""
    scale = (1.0 / mass).float()[:, None]  # inf without mass: nothing is kept then
    sampled = torch.where(keep, e * scale, 0.0)
    rows = torch.where((temperature == 0)[:, None], greedy, sampled)
    return torch.where(out_of_range(temperature, top_k, top_p, min_p)[:, None], 0.0, rows)


def processed_requests(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, min_p: torch.Tensor, process=None,
                       min_p_last: bool = False) -> torch.Tensor:
    """The float32 rows (B, rows, V) of requests' rows of logits (B, rows, V), each request's
    parameters (1 or B values each) applied to every row of it, by ``process`` (the rows (R, V)
    and R values each: ``processed_rows`` by default, or a faster way to the same rows), in the
    order ``min_p_last`` says."""
    out = (process or processed_rows)(*request_rows(logits, (temperature, top_k, top_p, min_p)),
                                      min_p_last=min_p_last)
    return out.reshape(logits.shape)


def request_rows(logits: torch.Tensor, parameters: tuple) -> tuple:
    """Requests' rows of logits (B, rows, V) as rows (R, V), R = B * rows, and the parameters
    (temperature, top_k, top_p, min_p: 1 or B values each) as R values each."""
    batch, rows, vocab = logits.shape
    return (logits.reshape(batch * rows, vocab),
            *(per_row(value, batch, rows) for value in parameters))


def processed_request_sets(sets: list[tuple], process_sets=None, min_p_last: bool = False
                           ) -> list[torch.Tensor]:
    """``processed_requests`` of each (logits (B, rows, V), parameters) of ``sets`` (a target's
    rows and a draft's, say), by ``process_sets``: from a list of ``request_rows``, the processed
    rows (R, V) of each, in order; by default ``processed_rows`` of each, apart."""
    flat = [request_rows(logits, parameters) for logits, parameters in sets]
    out = (process_sets or each_processed)(flat, min_p_last)
    return [rows.reshape(logits.shape) for rows, (logits, _) in zip(out, sets)]


def each_processed(sets: list[tuple], min_p_last: bool = False) -> list[torch.Tensor]:
    """``processed_rows`` of each (rows (R, V), temperature, top_k, top_p, min_p) in sets."""
    return [processed_rows(*rows, min_p_last=min_p_last) for rows in sets]


# ``processing_order``'s values, and whether each applies min-p last.
ORDERS = {"vllm": False, "transformers": True}


BITS = 32  # tokens per word of a grammar bitmask


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool (..., V) of an int32 bitmask (..., ceil(V / 32)) in the layout vLLM, SGLang and
    XGrammar share: bit i % 32 of word i // 32 set where token i is allowed."""
    return unpacked_bits(bitmask)[..., :vocab].bool()


def unpacked_bits(bitmask: torch.Tensor) -> torch.Tensor:
    """int32 (..., 32 * W) of an int32 bitmask (..., W): bit i % 32 of word i // 32 at i."""
    shifts = torch.arange(BITS, device=bitmask.device, dtype=torch.int32)
    return ((bitmask[..., None] >> shifts) & 1).flatten(-2)


# float32 -inf's bits as an int32: 0xFF800000.
MINUS_INF_BITS = -(2**23)


def blocked(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 (..., V) of an int32 bitmask (..., ceil(V / 32)) (``allowed_tokens``' layout), to
    add to the logits: 0 where a token is allowed, -inf where it is not. Formed from the bits by
    integer operations (-inf's bit pattern where a bit is clear, 0 where set): on a CPU a
    ``torch.where`` or ``masked_fill`` over an irregular boolean mask, as grammar masks are,
    costs about ten times as much."""
    clear = unpacked_bits(bitmask) - 1  # 0 where set, -1 (every bit) where clear
    return (clear & MINUS_INF_BITS).view(torch.float32)[..., :vocab]


def packed_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """The int32 bitmask (..., ceil(V / 32)) of bool rows (..., V): ``allowed_tokens``' inverse,
    for callers that hold their masks as booleans."""
    words = -(-allowed.shape[-1] // BITS)
    bits = torch.zeros(*allowed.shape[:-1], words * BITS, dtype=torch.int64, device=allowed.device)
    bits[..., :allowed.shape[-1]] = allowed.long()
    shifts = torch.arange(BITS, dtype=torch.int64, device=allowed.device)
    packed = (bits.view(*allowed.shape[:-1], words, BITS) << shifts).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def adjusted_logits(logits: torch.Tensor, logit_bias: torch.Tensor | None = None,
                    bitmask: torch.Tensor | None = None, penalties: Penalties | None = None,
                    generated: torch.Tensor | None = None) -> torch.Tensor:
    """Step 0 for requests' rows of logits (B, rows, V): float32 x + logit_bias (B, V) (each
    request's, on each of its rows), plus -inf where bitmask (B, rows, ceil(V / 32)) does not
    allow a token (-inf for every finite logit; a NaN or +inf one gives NaN, which counts as
    -inf all the same), then ``penalized`` by ``penalties`` with each row's ``generated`` counts
    (B, rows, V). The logits as they are when none is given."""
    if logit_bias is None and bitmask is None and penalties is None:
        return logits  # as given: no copy
    x = logits.float()
    if logit_bias is not None:
        x = x + logit_bias.float()[:, None, :]
    if bitmask is not None:
        x = x + blocked(bitmask, x.shape[-1])
    if penalties is not None:
        x = penalized(x, penalties, generated)
    return x


class Penalties(NamedTuple):
    """A request's penalties with vLLM's meaning (1 or B values each; 1, 0, 0: off) and what they
    count: ``counts`` (B, V) int, each token's occurrences in the output so far; ``prompt``
    (B, V) bool or None, the tokens of the prompt (the repetition penalty's only)."""

    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    counts: torch.Tensor
    prompt: torch.Tensor | None = None


class Step(NamedTuple):
    """Step 0's inputs as a from-logits op takes them, its last arguments, each None (off) by
    default."""

    logit_bias: torch.Tensor | None = None  # (B, V) float
    allowed_token_bitmask: torch.Tensor | None = None  # (*rows, ceil(V / 32)) int32
    repetition_penalty: torch.Tensor | None = None  # (1,) or (B,) float each
    frequency_penalty: torch.Tensor | None = None
    presence_penalty: torch.Tensor | None = None
    output_token_counts: torch.Tensor | None = None  # (B, V) int32/int64
    prompt_token_mask: torch.Tensor | None = None  # (B, V) bool

    def penalties(self) -> Penalties | None:
        """The rule's penalties (those not given off: 1, 0, 0), or None where none is given."""
        given = (self.repetition_penalty, self.frequency_penalty, self.presence_penalty)
        if all(value is None for value in given):
            return None
        device = self.output_token_counts.device
        values = [torch.full((1,), off, device=device) if value is None else value
                  for value, off in zip(given, (1.0, 0.0, 0.0))]
        return Penalties(*values, self.output_token_counts, self.prompt_token_mask)

    def changes_logits(self) -> bool:
        """Whether ``adjusted`` changes any logit: counts or a prompt mask without a penalty do
        not."""
        return any(value is not None for value in (
            self.logit_bias, self.allowed_token_bitmask, self.repetition_penalty,
            self.frequency_penalty, self.presence_penalty))

    def adjusted(self, logits: torch.Tensor, generated=None) -> torch.Tensor:
        """``adjusted_logits`` of requests' rows (B, rows, V) by this step; ``generated``:
        the rows' generated counts (B, rows, V), or a function of the output's counts (B, V)
        that gives them, needed where a penalty is given."""
        penalties = self.penalties()
        if penalties is not None and callable(generated):
            generated = generated(penalties.counts)
        return adjusted_logits(logits, self.logit_bias, self.allowed_token_bitmask, penalties,
                               generated)


# A from-logits op's arguments after its four sampling parameters: the draft's four, step 0's
# (Step), the processing order; a launcher's own arguments may follow them.
OPTIONAL = 4 + len(Step._fields) + 1


def optional_arguments(rest: tuple) -> tuple[tuple, Step, str, tuple]:
    """(the draft's four parameters, the Step, the processing order, the arguments after them) of
    a from-logits op's arguments after min_p, defaults where the dispatcher left them out."""
    given = tuple(rest[:OPTIONAL]) + (None,) * (OPTIONAL - len(rest[:OPTIONAL]))
    return given[:4], Step(*given[4:-1]), given[-1] or "vllm", tuple(rest[OPTIONAL:])


def penalties_in_range(penalties: Penalties) -> torch.Tensor:
    """(B,) or (1,) bool: a repetition penalty > 0, finite frequency and presence penalties."""
    return ((penalties.repetition > 0) & (penalties.repetition < torch.inf)
            & torch.isfinite(penalties.frequency) & torch.isfinite(penalties.presence))


def penalized(x: torch.Tensor, penalties: Penalties, generated: torch.Tensor) -> torch.Tensor:
    """Requests' rows of logits (B, rows, V) float32 under their penalties, in vLLM's order:
    where a token was generated (``generated`` (B, rows, V): the output's counts plus the drafts
    before each row) or is in the prompt, a positive logit divided by the repetition penalty and
    any other multiplied by it; then the frequency penalty times the count and the presence
    penalty where the count is positive subtracted (float32, in that order). A request whose
    penalties are out of range gets rows of NaN: no mass."""
    def each(value):  # (1 or B,) -> broadcast over rows and tokens
        return value.float()[:, None, None]

    seen = generated > 0
    if penalties.prompt is not None:
        seen = seen | penalties.prompt[:, None, :]
    r = each(penalties.repetition)
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    x = x - each(penalties.frequency) * generated.float()
    x = x - each(penalties.presence) * (generated > 0).float()
    return torch.where(each(penalties_in_range(penalties)) > 0, x, torch.nan)


def generated_counts(counts: torch.Tensor, drafts: torch.Tensor, before: torch.Tensor
                     ) -> torch.Tensor:
    """(R, V) int32: each row's output counts (R, V) plus one for each of its drafts (R, K) (ids;
    those outside [0, V), and all after the first of them, not counted) at the positions
    ``before`` (R, K) marks: a scatter of K ids a row, not a pass over V per draft."""
    vocab = counts.shape[-1]
    inside = (drafts >= 0) & (drafts < vocab)
    counted = (inside.int().cumprod(dim=-1) * before).int()  # the first id outside ends them
    return counts.int().scatter_add(1, drafts.long().clamp(0, vocab - 1), counted)


def listed_generated(counts: torch.Tensor, lists: torch.Tensor) -> torch.Tensor:
    """(B, P, V) int32: row p's generated tokens, the output's counts (B, V) and the first p ids
    of its list ``lists[b, p]`` ((B, P, K) ids; those outside [0, V), and all after the first of
    them, not counted): a chain's row p lists its drafts, a tree node's row its path."""
    batch, positions, length = lists.shape
    vocab = counts.shape[-1]
    before = torch.arange(positions, device=counts.device)[:, None] > torch.arange(
        length, device=counts.device)
    return generated_counts(
        counts[:, None, :].expand(batch, positions, vocab).reshape(batch * positions, vocab),
        lists.reshape(batch * positions, length),
        before.expand(batch, positions, length).reshape(batch * positions, length)
    ).view(batch, positions, vocab)


def chain_generated(counts: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """(B, N + 1, V) int32: row j's generated tokens, the output's counts (B, V) and drafts
    0..j-1 of the request's (B, N) drafts (those before its first id outside [0, V))."""
    batch, num_draft = draft_token_ids.shape
    return listed_generated(counts, draft_token_ids[:, None, :].expand(batch, num_draft + 1, -1))


def adjusted_at(x: torch.Tensor, ids: torch.Tensor, vocab: int, step: Step,
                words: torch.Tensor | None = None, lists: torch.Tensor | None = None
                ) -> torch.Tensor:
    """``adjusted_logits`` at a few tokens: float32 logits x (B, P, K) of requests' rows at ids
    (B, P, K) in [0, V), ``words`` (B, P, K) each token's word of its row's bitmask (where a mask
    is given), ``lists`` (B, P, L) each row's generated ids (``listed_generated``; None: none):
    the same float32 operations on K values a row instead of V."""
    batch, positions, k = ids.shape

    def at(rows):  # a request's (B, V) tensor at the tokens
        return rows.gather(1, ids.reshape(batch, positions * k)).view(ids.shape)

    if step.logit_bias is not None:
        x = x + at(step.logit_bias).float()
    if step.allowed_token_bitmask is not None:
        x = x.masked_fill(((words >> (ids % BITS)) & 1) == 0, -torch.inf)
    penalties = step.penalties()
    if penalties is None:
        return x
    count = at(penalties.counts).int()
    if lists is not None:
        length = lists.shape[-1]
        counted = (((lists >= 0) & (lists < vocab)).int().cumprod(dim=-1).bool()
                   & (torch.arange(positions, device=ids.device)[:, None]
                      > torch.arange(length, device=ids.device)))
        # Each token's occurrences in its row's sorted list (-1 where not counted): (B, P, L)
        # and (B, P, K) values, where comparing every token with every id would be K * L a row.
        listed = torch.where(counted, lists.long(), -1).sort(dim=-1).values
        listed, wanted = listed.view(batch * positions, length), ids.long().view(batch * positions, k)
        count = count + (torch.searchsorted(listed, wanted, right=True)
                         - torch.searchsorted(listed, wanted)).view(ids.shape).int()

    def each(value):  # a request's penalty, one row a "request" of K tokens
        return value if value.shape[0] == 1 else value.repeat_interleave(positions)

    rows = Penalties(each(penalties.repetition), each(penalties.frequency),
                     each(penalties.presence), count,
                     None if penalties.prompt is None else
                     at(penalties.prompt).view(batch * positions, k))
    return penalized(x.view(batch * positions, 1, k), rows,
                     count.view(batch * positions, 1, k)).view(ids.shape)


def drafts_own(draft_parameters, parameters) -> tuple:
    """The parameters (temperature, top_k, top_p, min_p) that process draft logits: the draft's
    own where given, the target's where None (the drafter sampled as the target is sampled)."""
    return tuple(t if d is None else d for d, t in zip(draft_parameters, parameters))


def per_row(value: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
    """A parameter of 1 or B values (one per request) as one value per row of the requests'
    (B, rows, V) rows, flattened: (B * rows,). A float parameter is read as float32, as the
    kernels read it: a float64 value counts as its float32 rounding (a temperature that rounds
    to 0 is greedy, a top-p that rounds to 1 is off)."""
    if value.dtype == torch.float64:
        value = value.float()
    if batch == 1:  # one request: its value for every row, as a view
        return value.expand(rows)
    return value.expand(batch).repeat_interleave(rows)
