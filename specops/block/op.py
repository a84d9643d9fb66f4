"""``torch.ops.specops.chain_block_speculative_sampling``: block verification, registered as a torch
op with the schema of token verification's op (specops/core/registry.py)."""

from __future__ import annotations

from ..core.registry import register_verifier
from .reference import block_speculative_sampling_reference


def _triton():
    from .launch import block_speculative_sampling_triton

    return block_speculative_sampling_triton


# The reference serves CPU tensors too: it is vectorised, and block verification has no CPU
# shortcut of its own yet.
chain_block_speculative_sampling_op = register_verifier(
    "specops::chain_block_speculative_sampling",
    reference=block_speculative_sampling_reference,
    cpu=block_speculative_sampling_reference,
    triton=_triton,
)
