"""Triton twin of ``drafts.py`` (beside this file): a request's drafts read as both verifiers of a
chain read them (docs/token.md, steps 2-3), in the token and block kernels."""

import triton
import triton.language as tl

from ..core.sampling.values_triton import STATS, probabilities_at
from ..core.sampling.probs_triton import ABSENT, widen
from ..core.sampling.step_triton import adjusted_drafts


@triton.jit
def draft_probabilities(target_row0, draft_row0, ids0, target_stats0, draft_stats0, num_draft,
                        vocab, stride_tn, stride_dn, stride_in, HAS_DRAFT: tl.constexpr,
                        BLOCK_N: tl.constexpr, LOGITS: tl.constexpr, DRAFT_LOGITS: tl.constexpr,
                        STEP: tl.constexpr = 0, step0=None):
    """Lanes j = 0..BLOCK_N-1 of a request whose rows start at target_row0, draft_row0, ids0 (and
    whose rows' statistics start at target_stats0, draft_stats0): (j, whether j is a draft
    position, the draft ids d (-1 past its num_draft drafts), whether d_j is a token in [0, V),
    p_j[d_j], q_j[d_j] (1.0 without draft rows)). Invalid ids are never dereferenced; with LOGITS
    (DRAFT_LOGITS) the rows are logits, read through their rows' statistics, the target's after
    rule step 0 where STEP is on (``step0``: row 0's context, core/sampling/step_triton.py)."""
    j = tl.arange(0, BLOCK_N)
    j64 = j.to(tl.int64)
    is_draft = j < num_draft
    d = tl.load(ids0 + j64 * stride_in, mask=is_draft, other=-1).to(tl.int64)
    valid = is_draft & (d >= 0) & (d < vocab)
    d_safe = tl.where(valid, d, 0)
    raw_p = tl.load(target_row0 + j64 * stride_tn + d_safe, mask=valid, other=ABSENT)
    if STEP:
        raw_p = adjusted_drafts(widen(raw_p), d, valid, vocab, step0, STEP, BLOCK_N)
    p_d = probabilities_at(raw_p, target_stats0 + j64 * STATS, d, valid, LOGITS)
    if HAS_DRAFT:
        q_d = probabilities_at(
            tl.load(draft_row0 + j64 * stride_dn + d_safe, mask=valid, other=ABSENT),
            draft_stats0 + j64 * STATS, d, valid, DRAFT_LOGITS)
    else:
        q_d = tl.full([BLOCK_N], 1.0, tl.float32)
    return j, is_draft, d, valid, p_d, q_d
