"""A flattened batch laid out as the padded batch it stands for: request b's drafts are [cu[b],
cu[b + 1]) of the T drafts, its target rows the N_b + 1 from row cu[b] + b; the padded batch holds
them at (b, 0..N_b), its drafts padded with -1 to max_num_draft_tokens. The torch twin of
``core/launch/rows_triton.py``'s ``flattened_request``, which clamps a bad layout as ``spans``
does here; what ``specops.varlen``'s references and the logprobs op's plain rule read."""

from __future__ import annotations

import torch


def spans(cu: torch.Tensor, num_tokens: int, max_num_draft_tokens: int):
    """(start, n), (B,) int64 each: request b's first draft and its number of drafts, clamped so
    that no layout reads past the T drafts: start in [0, T], n in [0, min(max, T - start)].
    A valid layout (docs/api.md, "Flattened batches") is left as it is."""
    start = cu[:-1].to(torch.int64).clamp(0, num_tokens)
    n = torch.minimum(cu[1:].to(torch.int64) - start, num_tokens - start)
    return start, n.clamp(0, max_num_draft_tokens)


class Padded:
    """Where the padded batch's entries come from: ``target_rows`` (B, M + 1) and ``draft_rows``
    (B, M) index the flattened rows, ``is_draft`` (B, M) marks the drafts (M:
    max_num_draft_tokens). Past a request's drafts its last target row and its first draft row
    (any rows would do: the padded function reads none of them) fill the padding."""

    def __init__(self, cu: torch.Tensor, num_tokens: int, max_num_draft_tokens: int):
        start, n = spans(cu, num_tokens, max_num_draft_tokens)
        batch = start.shape[0]
        request = torch.arange(batch, device=cu.device)[:, None]
        t = torch.arange(max_num_draft_tokens + 1, device=cu.device)
        self.target_rows = start[:, None] + request + torch.minimum(t, n[:, None])
        self.is_draft = t[:-1] < n[:, None]
        self.draft_rows = torch.where(self.is_draft, start[:, None] + t[:-1], 0)
        self.num_tokens = num_tokens

    def targets(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, M + 1, V) of the (T + B, V) target rows."""
        return rows[self.target_rows]

    def drafts(self, rows: torch.Tensor | None) -> torch.Tensor | None:
        """(B, M, V) of the (T, V) draft rows (None stays None)."""
        if rows is None:
            return None
        if self.num_tokens == 0:  # no draft row to repeat: the padding is zeros
            return rows.new_zeros((*self.draft_rows.shape, rows.shape[1]))
        return rows[self.draft_rows]

    def ids(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, M) draft ids of the (T,) ones, -1 past each request's drafts."""
        if self.num_tokens == 0:
            return ids.new_full(self.draft_rows.shape, -1)
        return torch.where(self.is_draft, ids[self.draft_rows], -1)
