"""Registration of ``torch.ops.specops.chain_speculative_sampling`` (the op compiled models call).

One ``torch.library.custom_op`` with a CPU and a CUDA kernel that share argument checking and
backend selection, and a fake (meta) implementation for tracing.  The numerics live elsewhere:
``reference.py`` (pure torch) and ``kernels/chain_speculative_sampling.py`` (Triton).

Backend: ``SPECOPS_BACKEND=torch`` forces the reference, ``=triton`` forces the Triton kernel (on CPU
tensors it needs ``TRITON_INTERPRET=1`` set before triton is imported); unset or ``auto`` picks
Triton for CUDA tensors and the reference for CPU tensors.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .reference import chain_speculative_sampling_reference
from .validation import check_arguments, check_values, validation_enabled

BACKENDS = ("auto", "torch", "triton")


def selected_backend(device: torch.device) -> str:
    """'torch' or 'triton' for tensors on ``device``, honouring SPECOPS_BACKEND."""
    choice = os.environ.get("SPECOPS_BACKEND", "auto").strip().lower() or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"SPECOPS_BACKEND must be one of {', '.join(BACKENDS)}; got {choice!r}")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return choice


def _chain_speculative_sampling_eager(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool = True,
) -> torch.Tensor:
    args = (draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset)
    check_arguments(*args)
    if validation_enabled():
        check_values(draft_probs, draft_token_ids, target_probs)
    if selected_backend(target_probs.device) == "triton":
        from .kernels.chain_speculative_sampling import chain_speculative_sampling_triton

        return chain_speculative_sampling_triton(*args)
    return chain_speculative_sampling_reference(*args)


# The schema of SPEC.md, spelled out (the inferred one would name the aliases a3!/a4!).
# `deterministic` is accepted for FlashInfer compatibility: every backend is reproducible.
SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, "
    "Tensor(a!) accepted_num, Tensor(b!) emitted_num, Tensor seed, Tensor offset, "
    "bool deterministic=True) -> Tensor"
)

chain_speculative_sampling_op = torch.library.custom_op(
    "specops::chain_speculative_sampling",
    _chain_speculative_sampling_eager,
    mutates_args=("accepted_num", "emitted_num"),
    device_types="cpu",
    schema=SCHEMA,
)
chain_speculative_sampling_op.register_kernel("cuda")(_chain_speculative_sampling_eager)


@chain_speculative_sampling_op.register_fake
def _chain_speculative_sampling_fake(
    draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
    deterministic=True,
):
    check_arguments(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset)
    batch, num_draft = draft_token_ids.shape
    return target_probs.new_empty((batch, num_draft + 1), dtype=torch.int32)
