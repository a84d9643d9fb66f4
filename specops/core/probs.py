"""Reading probabilities as every sampler's rules read them (docs/semantics.md, steps 2-3)."""

from __future__ import annotations

import torch


def sanitize(probs: torch.Tensor) -> torch.Tensor:
    """Float32 copy in which NaN, +-inf and negative probabilities count as 0."""
    probs = probs.float()
    return torch.where(torch.isfinite(probs) & (probs > 0), probs, 0.0)


def at_draft_ids(probs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """probs[b, j, ids[b, j]] for every b and every draft position j: (B, N)."""
    return probs[:, : ids.shape[1]].gather(2, ids[:, :, None]).squeeze(2)


def rows_at(probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Row probs[b, position[b]] of every request b: (B, M, V) -> (B, V)."""
    return probs[torch.arange(probs.shape[0], device=probs.device), position]
