"""The entropy of each row's processed distribution, read through the row's statistics
(core/logits/triton.py), one program per row: no processed row is written."""

import triton
import triton.language as tl

from ..sampling.probs_triton import widen
from ..sampling.values_triton import SAMPLED, STATS, load_stats, processed

LN2 = tl.constexpr(0.6931471805599453)


# Specialised on the row addressing only (the logits pointer, V and the row strides), as the
# statistics kernel: no number of rows compiles another kernel.
@triton.jit(do_not_specialize=["stats_ptr", "out_ptr", "positions"])
def row_entropy_kernel(
    logits_ptr,  # (B, positions, V) logits, vocabulary stride 1
    stats_ptr,  # (B * positions, STATS) float64: the rows' statistics
    out_ptr,  # (B * positions,) float32, written
    positions, vocab, stride_b, stride_n,
    CHUNK: tl.constexpr,
):
    """Program ``row``: H = ln W * sum p - ln 2 * sum p t over the row, p its processed
    probabilities and t = (x - m) c the base-2 log of a kept token's weight (a p of 0 adds
    nothing); 0 for a greedy row and a row without mass."""
    row = tl.program_id(0).to(tl.int64)
    mode, peak, coef, limit, scale, index = load_stats(stats_ptr + row * STATS)
    base = logits_ptr + (row // positions) * stride_b + (row % positions) * stride_n
    lane = tl.arange(0, CHUNK)
    mass = tl.zeros([CHUNK], tl.float32)
    weighted = tl.zeros([CHUNK], tl.float32)
    for first in range(0, vocab, CHUNK):
        column = first + lane
        x = widen(tl.load(base + column, mask=column < vocab, other=-float("inf")))
        p = processed(x, peak, coef, limit, scale)
        mass += p
        weighted += tl.where(p > 0, p * ((x - peak) * coef), 0.0)
    entropy = -tl.log(scale) * tl.sum(mass, 0) - LN2 * tl.sum(weighted, 0)
    tl.store(out_ptr + row, tl.where(mode == SAMPLED, entropy, 0.0))
