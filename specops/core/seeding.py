"""Turning the public functions' ``seed`` / ``offset`` / ``generator`` into the ops' int64 tensors."""

from __future__ import annotations

from typing import Optional, Union

import torch

SeedLike = Union[int, torch.Tensor, None]


def as_int64_tensor(name: str, value: Union[int, torch.Tensor], device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dtype not in (torch.int32, torch.int64) or value.dim() > 1:
            raise TypeError(
                f"{name} must be an int or a 0-D/1-D int64 (or int32) tensor; "
                f"got {value.dtype} tensor of shape {tuple(value.shape)}"
            )
        return value.to(device=device, dtype=torch.int64).reshape(-1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or an int64 tensor; got {type(value).__name__}")
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{name} must fit in 64 bits; got {value}")
    if value >= 2**63:  # a uint64 seed: keep its bits
        value -= 2**64
    return torch.tensor([value], dtype=torch.int64, device=device)


def random_seed_and_offset(
    generator: Optional[torch.Generator], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh (seed, offset) pair drawn on ``device`` from ``generator`` (default: the device's).

    Drawn by a device-side random op, not read on the host: reproducible under torch.manual_seed,
    fresh on every call, and fresh on every replay of a captured CUDA graph.
    """
    # torch.randint (unlike Tensor.random_) also traces under torch.compile(fullgraph=True).
    drawn = torch.randint(
        -(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=device, generator=generator
    )
    return drawn[:1], drawn[1:]


def resolve_seed_and_offset(
    seed: SeedLike, offset: SeedLike, generator: Optional[torch.Generator], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (seed, offset) int64 tensors an op takes (docs/randomness.md, "When no seed is given")."""
    if seed is None:
        seed_t, offset_t = random_seed_and_offset(generator, device)
    else:
        seed_t, offset_t = as_int64_tensor("seed", seed, device), None
    if offset is not None:
        offset_t = as_int64_tensor("offset", offset, device)
    elif offset_t is None:
        offset_t = torch.zeros(1, dtype=torch.int64, device=device)
    return seed_t, offset_t
