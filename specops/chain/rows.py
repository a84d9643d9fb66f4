"""Where a chain launcher's rows are: a padded batch, or a flattened one (``specops.varlen``),
in the form the kernels' ``request_rows`` (rows_triton.py) reads them."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.launch.launcher import placeholder


class Rows(NamedTuple):
    batch: int
    num_draft: int  # N (flattened: the most drafts of a request)
    num_tokens: int  # flattened: T, every request's drafts (padded: unused)
    cu: torch.Tensor  # flattened: (B + 1,) cumulative draft counts (padded: a placeholder)
    target: torch.Tensor  # vocabulary stride 1
    target_strides: tuple[int, int]  # (request, position); flattened: (0, row)
    draft: torch.Tensor | None  # vocabulary stride 1; None: one-hot drafts, or no draft row
    draft_strides: tuple[int, int]
    ids_strides: tuple[int, int]


def _unit_stride(rows: torch.Tensor) -> torch.Tensor:
    """The row passes need unit vocabulary stride (16-byte loads); other strides are kept."""
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def padded_rows(draft_probs, draft_token_ids, target_probs) -> Rows:
    """A padded batch: (B, N, V) drafts, (B, N) ids, (B, N + 1, V) target rows."""
    batch, num_draft = draft_token_ids.shape
    target = _unit_stride(target_probs)
    # N = 0: no draft row exists: read none (an empty tensor's pointer is no row).
    draft = _unit_stride(draft_probs) if draft_probs is not None and num_draft else None
    return Rows(batch, num_draft, 0, placeholder(target.device, torch.int64), target,
                target.stride()[:2], draft, (0, 0) if draft is None else draft.stride()[:2],
                draft_token_ids.stride())


class Flattened(NamedTuple):
    """A flattened batch's layout: request b's drafts are [cu[b], cu[b + 1]) of the T drafts, its
    target rows N_b + 1 from row cu[b] + b; the output is (B, max_num_draft_tokens + 1)."""

    cu_num_draft_tokens: torch.Tensor
    max_num_draft_tokens: int

    def rows(self, draft_probs, draft_token_ids, target_probs) -> Rows:
        """(T, V) drafts, (T,) ids, (T + B, V) target rows."""
        cu = self.cu_num_draft_tokens
        num_tokens = draft_token_ids.shape[0]
        target = _unit_stride(target_probs)
        draft = _unit_stride(draft_probs) if draft_probs is not None and num_tokens else None
        return Rows(cu.shape[0] - 1, self.max_num_draft_tokens, num_tokens, cu, target,
                    (0, target.stride(0)), draft, (0, 0) if draft is None else (0, draft.stride(0)),
                    (0, draft_token_ids.stride(0)))
