"""``torch.ops.specops.chain_block_speculative_sampling``: block verification, registered as a torch
op with the schema of token verification's op (``specops/chain/verifier.py``)."""

from __future__ import annotations

from ...core.registry import Backends
from ..from_logits import register_logits_verifier
from ..verifier import register_verifier
from .cpu import block_speculative_sampling_cpu, block_speculative_sampling_from_logits_cpu
from .reference import (block_speculative_sampling_from_logits_reference,
                        block_speculative_sampling_reference)


_launch = None


def _triton():
    global _launch  # imported on first use: importing triton is not free
    if _launch is None:
        from . import launch as _launch
    return _launch.block_speculative_sampling_triton


def _triton_from_logits():
    global _launch
    if _launch is None:
        from . import launch as _launch
    return _launch.block_speculative_sampling_from_logits_triton


chain_block_speculative_sampling_op = register_verifier(
    "specops::chain_block_speculative_sampling",
    Backends(reference=block_speculative_sampling_reference,
             cpu=block_speculative_sampling_cpu, triton=_triton),
)

chain_block_speculative_sampling_from_logits_op = register_logits_verifier(
    "specops::chain_block_speculative_sampling_from_logits",
    Backends(reference=block_speculative_sampling_from_logits_reference,
             cpu=block_speculative_sampling_from_logits_cpu, triton=_triton_from_logits),
)
