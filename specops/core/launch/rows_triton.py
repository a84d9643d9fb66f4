"""A flattened batch's requests, as the kernels read them (``specops.varlen``): T drafts of all
requests in one tensor, request b's at [cu[b], cu[b + 1]); the target's T + B rows, request b's
N_b + 1 from row cu[b] + b. The torch twin, whose clamping this mirrors, is
core/sampling/flattened.py."""

import triton
import triton.language as tl


@triton.jit
def flattened_request(b, cu_ptr, max_drafts, num_tokens):
    """(start, n) of request b: its first draft's index and its number of drafts, from ``cu``
    clamped so that no layout, however bad, reads past the T drafts: start in [0, T], n in
    [0, min(max_drafts, T - start)]."""
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + b).to(tl.int64), 0), num_tokens)
    n = tl.load(cu_ptr + b + 1).to(tl.int64) - start
    return start, tl.maximum(tl.minimum(n, tl.minimum(max_drafts, num_tokens - start)), 0)
