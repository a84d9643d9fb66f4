"""Reading probabilities as every sampler's rules read them: NaN, infinite and negative values count
as 0 (docs/semantics.md)."""

from __future__ import annotations

import torch


def sanitize(probs: torch.Tensor) -> torch.Tensor:
    """Float32 copy in which NaN, +-inf and negative probabilities count as 0."""
    probs = probs.float()
    return torch.where(torch.isfinite(probs) & (probs > 0), probs, 0.0)


def rows_at(probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Row probs[b, position[b]] of every request b: (B, M, V) -> (B, V)."""
    return probs[torch.arange(probs.shape[0], device=probs.device), position]
