"""Triton twin of rule step 0 (``core/logits/rule.py``'s ``adjusted_logits``): a row's logits
adjusted by its grammar mask, its request's logit bias and penalties while a kernel reads them,
so that no adjusted row is written. Which parts are on is the constexpr STEP (the sum of the
flags below, and with penalties the most drafts before a row times DRAFTS); with STEP = 0 nothing
here is compiled into a kernel.

Context, as tuples the kernels build once:
- a request's (``request_step``): (bias row, counts row, prompt row, repetition, frequency,
  presence, 1 / repetition), each row (V,) of the (B, V) tensors, the penalties float32 and
  1 / repetition float64;
- a row's (``row_step``): (the request's, the row's bitmask words, the request's first draft id
  and its stride, how many drafts before the row count as generated).
"""

import triton
import triton.language as tl

from .probs_triton import widen

BIAS = tl.constexpr(1)  # logit_bias (B, V)
MASK = tl.constexpr(2)  # allowed_token_bitmask, a row of ceil(V / 32) int32 words per target row
# penalties (1 or B, 4) float64: repetition r, frequency, presence, RN(1 / float32(r)); and
# output_token_counts (B, V)
PENALTIES = tl.constexpr(4)
PROMPT = tl.constexpr(8)  # prompt_token_mask (B, V) bool, read with the penalties
# STEP's higher part: with penalties, DRAFTS times the most drafts before a row (a power of two
# at least N), which a chunk read counts unrolled up to UNROLLED of them, in a loop beyond.
DRAFTS = tl.constexpr(16)
UNROLLED = tl.constexpr(16)
WORD_BITS = tl.constexpr(32)


@triton.jit
def request_step(b, vocab, bias_ptr, counts_ptr, prompt_ptr, penalties_ptr, penalty_stride,
                 STEP: tl.constexpr):
    """Request b's context (module docstring): its rows of the contiguous (B, V) tensors and its
    penalties (1, 0, 0 where off; NaN where out of range, which leaves its rows without mass as
    ``rule.penalized`` does)."""
    repetition = tl.full([], 1.0, tl.float32)
    frequency = tl.zeros([], tl.float32)
    presence = tl.zeros([], tl.float32)
    inverse = tl.full([], 1.0, tl.float64)
    if PENALTIES & STEP:
        values = penalties_ptr + b * penalty_stride
        r = tl.load(values)
        f = tl.load(values + 1)
        p = tl.load(values + 2)
        # The range as rule.penalties_in_range checks it, on the values as given (float64).
        in_range = ((r > 0) & (r < float("inf")) & (tl.abs(f) < float("inf"))
                    & (tl.abs(p) < float("inf")))
        repetition = tl.where(in_range, r.to(tl.float32), float("nan"))
        frequency = f.to(tl.float32)
        presence = p.to(tl.float32)
        inverse = tl.load(values + 3)
    row = b * vocab
    return (bias_ptr + row, counts_ptr + row, prompt_ptr + row, repetition, frequency, presence,
            inverse)


@triton.jit
def drafts_before(ids0, stride_in, t, vocab):
    """How many of a request's drafts d_0 .. d_{t-1} count as generated at row t: those before
    its first id outside [0, V) (``rule.generated_counts``)."""
    count = tl.zeros([], tl.int32)
    running = t >= 0
    for k in range(0, t):
        d = tl.load(ids0 + k * stride_in)
        running = running & (d >= 0) & (d < vocab)
        count += running.to(tl.int32)
    return count


@triton.jit
def row_step(request, bitmask_ptr, row, vocab, ids0, stride_in, before):
    """A row's context: its request's ``request``, the row's bitmask words (``row``: its index
    among the target's rows as the bitmask lays them out) and the ``before`` drafts from ids0
    that count as generated at it."""
    return request, bitmask_ptr + row * tl.cdiv(vocab, WORD_BITS), ids0, stride_in, before


@triton.jit
def adjusted(x, cols, inside, mask_words, drafts, request, STEP: tl.constexpr):
    """Step 0 of float32 logits x at tokens ``cols`` (read where ``inside``), as
    rule.adjusted_logits: + the bias, -inf where the mask's word (at ``mask_words``, pointers
    shaped as cols or one row's base) lacks the token's bit, then the penalties with ``drafts``
    (int32, shaped as cols) of the drafts before the row counted with the output's counts."""
    bias_row, counts_row, prompt_row, repetition, frequency, presence, inverse = request
    if BIAS & STEP:
        x = x + widen(tl.load(bias_row + cols, mask=inside, other=0.0))
    if MASK & STEP:
        word = tl.load(mask_words + cols // WORD_BITS, mask=inside, other=0)
        x = tl.where(((word >> (cols % WORD_BITS)) & 1) != 0, x, -float("inf"))
    if PENALTIES & STEP:
        count = tl.load(counts_row + cols, mask=inside, other=0).to(tl.int32) + drafts
        seen = count > 0
        if PROMPT & STEP:
            seen = seen | (tl.load(prompt_row + cols, mask=inside, other=0) != 0)
        # x / r correctly rounded (where it is normal), without a division's slow-path call: a
        # float32 quotient lies at least 2^-49 (relatively) from any midpoint of float32 values,
        # x * RN(1/r) in float64 within 2^-52 of it, so both round to the same float32
        # (docs/internals/kernel.md has the subnormal exception).
        quotient = (x.to(tl.float64) * inverse).to(tl.float32)
        x = tl.where(seen, tl.where(x > 0, quotient, x * repetition), x)
        x = x - frequency * count.to(tl.float32)
        x = x - presence * (count > 0).to(tl.float32)
        x = tl.where(repetition == repetition, x, float("nan"))  # out of range: no mass
    return x


@triton.jit
def adjusted_row(x, start, lane, inside, step, STEP: tl.constexpr):
    """``adjusted`` for a chunk of one row, tokens start + lane, read through its context
    ``step`` (``row_step``). The drafts before the row are counted each with a scalar test of
    whether it falls in this chunk and a compare of the chunk only where it does: unrolled (no
    loop in the row loop) up to UNROLLED drafts, in a loop for longer chains (an unrolled copy per
    draft in every row loop would grow the kernel with N)."""
    request, mask_row, ids0, stride_in, before = step
    cols = start + lane
    drafts = tl.zeros(lane.shape, tl.int32)
    if PENALTIES & STEP:
        if STEP // DRAFTS <= UNROLLED:
            for k in tl.static_range(STEP // DRAFTS):
                if k < before:
                    d = tl.load(ids0 + k * stride_in)
                    if (d >= start) & (d < start + lane.shape[0]):
                        drafts += (lane == (d - start).to(tl.int32)).to(tl.int32)  # 32-bit
        else:
            for k in range(0, before):
                d = tl.load(ids0 + k * stride_in)
                if (d >= start) & (d < start + lane.shape[0]):
                    drafts += (lane == (d - start).to(tl.int32)).to(tl.int32)
    return adjusted(x, cols, inside, mask_row, drafts, request, STEP)


@triton.jit
def adjusted_drafts(x, d, valid, vocab, step0, STEP: tl.constexpr, BLOCK_N: tl.constexpr):
    """``adjusted`` of a request's logits x at its drafts d (lanes j, read where ``valid``), each
    from row j: ``step0`` is row 0's context (row j's bitmask words follow row 0's); the drafts
    before row j that count are those before the first invalid one."""
    request, mask_row, ids0, stride_in, before = step0
    j = tl.arange(0, BLOCK_N)
    counted = j < tl.min(tl.where(valid, BLOCK_N, j), axis=0)  # before the first invalid id
    same = (d[None, :] == d[:, None]) & (j[None, :] < j[:, None]) & counted[None, :]
    drafts = tl.sum(same.to(tl.int32), axis=1)
    mask_words = mask_row + j.to(tl.int64) * tl.cdiv(vocab, WORD_BITS)
    return adjusted(x, tl.where(valid, d, 0), valid, mask_words, drafts, request, STEP)


@triton.jit
def adjusted_at(x, token, step, STEP: tl.constexpr):
    """``adjusted`` of one logit x at ``token`` (a scalar in [0, V)) of the row whose context is
    ``step`` (``row_step``), the drafts before it counted in a loop."""
    request, mask_row, ids0, stride_in, before = step
    drafts = tl.zeros([], tl.int32)
    if PENALTIES & STEP:
        for k in range(0, before):
            drafts += (tl.load(ids0 + k * stride_in) == token).to(tl.int32)
    return adjusted(x, token, True, mask_row, drafts, request, STEP)


@triton.jit
def adjusted_draft(x, d, valid, i, vocab, step0, STEP: tl.constexpr):
    """``adjusted_drafts`` for one draft d = d_i (a scalar, read where ``valid``) from row i."""
    request, mask_row, ids0, stride_in, before = step0
    drafts = tl.zeros([], tl.int32)
    running = i >= 0
    for k in range(0, i):
        d_k = tl.load(ids0 + k * stride_in)
        running = running & (d_k >= 0) & (d_k < vocab)
        drafts += (running & (d_k == d)).to(tl.int32)
    return adjusted(x, tl.where(valid, d, 0), valid, mask_row + i * tl.cdiv(vocab, WORD_BITS),
                    drafts, request, STEP)
