"""Turning the public functions' ``seed`` / ``offset`` / ``generator`` into the ops' int64 tensors."""

from __future__ import annotations

import inspect
import operator
from typing import Optional, Union

import torch

SeedLike = Union[int, torch.Tensor, None]

GENERATOR_UNDER_COMPILE = (
    "generator= cannot be traced by torch.compile(fullgraph=True) (Dynamo cannot pass a "
    "torch.Generator to an op). "
    "Draw the seed and offset from the generator outside the compiled function and pass them as "
    "tensors: drawn = torch.randint(-2**63, 2**63 - 1, (2,), dtype=torch.int64, device=device, "
    "generator=generator); then seed=drawn[:1], offset=drawn[1:] gives the tokens generator= gives "
    "in eager mode (docs/recipes.md, \"A torch.Generator under torch.compile\"). Or pass seed=None "
    "without a generator: the device's default generator is traced."
)

def _constant(value: int, device: torch.device) -> torch.Tensor:
    return torch.full((1,), value, dtype=torch.int64, device=device)  # half torch.tensor's cost


def as_int64_tensor(name: str, value: Union[int, torch.Tensor],
                    device: torch.device) -> torch.Tensor:
    """``value`` as the 1-D int64 tensor on ``device`` an op takes. An int64 1-D tensor on the
    device is returned as it is (a CUDA graph reads its current values at every replay); other
    tensors are converted by a copy (docs/recipes.md: what that means in a CUDA graph)."""
    if isinstance(value, torch.Tensor):
        if value.dtype is torch.int64 and value.dim() == 1 and value.device == device:
            return value
        if value.dtype not in (torch.int32, torch.int64) or value.dim() > 1:
            raise TypeError(
                f"{name} must be an int or a 0-D/1-D int64 (or int32) tensor; "
                f"got {value.dtype} tensor of shape {tuple(value.shape)}"
            )
        if value.device != device and torch.device(device).type == "cuda" \
                and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                f"{name} is a tensor on {value.device}: copying it to {device} cannot be captured "
                "in a CUDA graph (the copy would be frozen, or refused); pass it on the device "
                "as an int64 tensor"
            )
        return value.to(device=device, dtype=torch.int64).reshape(-1)
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or an int64 tensor; got bool")
    try:
        value = operator.index(value)  # any integer: int, numpy.int64, ...
    except TypeError:
        raise TypeError(f"{name} must be an int or an int64 tensor; got {type(value).__name__}") \
            from None
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{name} must fit in 64 bits; got {value}")
    if value >= 2**63:  # a uint64 seed: keep its bits
        value -= 2**64
    return _constant(value, device)


def _draw(generator: Optional[torch.Generator], device: torch.device):
    # torch.randint (unlike Tensor.random_) also traces under torch.compile(fullgraph=True).
    # Drawn as (2, 1), the values of a (2,) draw, so that one unbind gives both 1-element rows.
    drawn = torch.randint(
        -(2**63), 2**63 - 1, (2, 1), dtype=torch.int64, device=device, generator=generator
    )
    seed, offset = drawn.unbind(0)
    return seed, offset


# Dynamo cannot pass a torch.Generator to an op: with one, the draw runs outside the graph (a graph
# break), and under fullgraph=True Dynamo refuses it with this reason in its error's first lines
# (torch releases whose compiler.disable takes no reason name the function instead).
_REASON = ({"reason": GENERATOR_UNDER_COMPILE}
           if "reason" in inspect.signature(torch.compiler.disable).parameters else {})
_draw_from_generator_outside_the_graph = torch.compiler.disable(_draw, **_REASON)


def random_seed_and_offset(
    generator: Optional[torch.Generator], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh (seed, offset) pair drawn on ``device`` from ``generator`` (default: the device's).

    Drawn by a device-side random op, not read on the host: reproducible under torch.manual_seed,
    fresh on every call, and fresh on every replay of a captured CUDA graph.
    """
    if generator is None:
        return _draw(None, device)
    return _draw_from_generator_outside_the_graph(generator, device)


def resolve_seed_and_offset(
    seed: SeedLike, offset: SeedLike, generator: Optional[torch.Generator], device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (seed, offset) int64 tensors an op takes (docs/internals/randomness.md, "When no seed is given")."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got "
                        f"{type(generator).__name__}")
    if seed is None:
        seed_t, offset_t = random_seed_and_offset(generator, device)
    else:
        seed_t, offset_t = as_int64_tensor("seed", seed, device), None
    if offset is not None:
        offset_t = as_int64_tensor("offset", offset, device)
    elif offset_t is None:
        offset_t = _constant(0, device)
    return seed_t, offset_t
