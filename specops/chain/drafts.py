"""Reading the drafts as both verifiers of a chain read them (docs/token.md, steps 2-3)."""

from __future__ import annotations

import torch


def at_draft_ids(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """probs[b, j, ids[b, j]] for every b and every draft position j: (B, N)."""
    return probs[:, : ids.shape[1]].gather(2, ids[:, :, None]).squeeze(2)
