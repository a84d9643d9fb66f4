"""Where a request's rows are, for the token and block kernels: a padded batch (B, N + 1, V) or a
flattened one (core/launch/rows_triton.py)."""

import triton
import triton.language as tl

from ..core.launch.rows_triton import flattened_request


@triton.jit
def request_rows(b, cu_ptr, target_ptr, draft_ptr, ids_ptr, num_draft, num_tokens, stride_tb,
                 stride_tn, stride_db, stride_dn, stride_ib, stride_in, VARLEN: tl.constexpr):
    """(request b's number of drafts n, its first target row, first draft row and first id).
    Padded: n = N, rows b of each tensor. VARLEN: n = cu[b + 1] - cu[b] (clamped), drafts from
    row cu[b] of the T drafts, target rows from row cu[b] + b."""
    if VARLEN:
        start, n = flattened_request(b, cu_ptr, num_draft, num_tokens)
        return (n.to(tl.int32), target_ptr + (start + b) * stride_tn, draft_ptr + start * stride_dn,
                ids_ptr + start * stride_in)
    return (num_draft, target_ptr + b * stride_tb,
            draft_ptr + b * stride_db, ids_ptr + b * stride_ib)


@triton.jit
def first_target_row(b, cu_ptr, num_draft, num_tokens, VARLEN: tl.constexpr):
    """Request b's first target row among all the target's rows (B (N + 1) padded, T + B
    flattened): where its rows' grammar bitmask rows start."""
    if VARLEN:
        start, n = flattened_request(b, cu_ptr, num_draft, num_tokens)
        return start + b
    return b * (num_draft + 1)
