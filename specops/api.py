"""FlashInfer-compatible Python API: ``specops.chain_speculative_sampling``.

A thin wrapper over ``torch.ops.specops.chain_speculative_sampling``: it allocates the counters when
none are given and turns ``seed`` / ``offset`` / ``generator`` into the op's int64 tensors.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from . import op as _op  # noqa: F401  (registers torch.ops.specops.chain_speculative_sampling)

SeedLike = Union[int, torch.Tensor, None]


def _as_int64_tensor(name: str, value: Union[int, torch.Tensor], device: torch.device) -> torch.Tensor:
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


def chain_speculative_sampling(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: SeedLike = None,
    offset: SeedLike = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling over a chain of draft tokens (Leviathan et al. 2023; Chen et al. 2023).

    Args:
        draft_probs: (B, N, V) float32/float16/bfloat16 draft-model probabilities, or None when the
            drafts were chosen greedily (one-hot draft distributions).
        draft_token_ids: (B, N) int32/int64 draft tokens; -1 (or any id outside [0, V)) ends a
            shorter draft.
        target_probs: (B, N + 1, V) target-model probabilities, same dtype as draft_probs.
        maybe_output_accepted_token_num: (B,) int32/int64 counter, added to in place: positions
            accepted by their own coin, each judged independently.
        maybe_output_emitted_draft_token_num: (B,) int32/int64 counter, added to in place: draft
            tokens emitted (the bonus/resampled token not counted).
        deterministic: accepted for compatibility; the output is always reproducible.
        generator: draws (seed, offset) when ``seed`` is None (default: the device's generator).
        seed: int, or int64 tensor of 1 or B elements (per-request seeds: batch invariance).
        offset: int, or int64 tensor of 1 or B elements; default 0 (or drawn, when seed is None).

    Returns:
        (output_token_ids (B, N + 1) int32 with -1 after the emitted tokens, accepted, emitted);
        the counters are the given tensors when given, new int32 tensors otherwise.
    """
    device = target_probs.device
    batch = target_probs.shape[0] if target_probs.dim() > 0 else 0
    accepted = maybe_output_accepted_token_num
    if accepted is None:
        accepted = torch.zeros(batch, dtype=torch.int32, device=device)
    emitted = maybe_output_emitted_draft_token_num
    if emitted is None:
        emitted = torch.zeros(batch, dtype=torch.int32, device=device)

    if seed is None:
        seed_t, offset_t = random_seed_and_offset(generator, device)
    else:
        seed_t, offset_t = _as_int64_tensor("seed", seed, device), None
    if offset is not None:
        offset_t = _as_int64_tensor("offset", offset, device)
    elif offset_t is None:
        offset_t = torch.zeros(1, dtype=torch.int64, device=device)

    output = torch.ops.specops.chain_speculative_sampling(
        draft_probs, draft_token_ids, target_probs, accepted, emitted, seed_t, offset_t,
        deterministic,
    )
    return output, accepted, emitted
