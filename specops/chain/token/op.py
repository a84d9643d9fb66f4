"""``torch.ops.specops.chain_speculative_sampling``: token verification, registered as a torch op."""

from __future__ import annotations

from ...core.registry import Backends
from ..from_logits import register_logits_verifier
from ..verifier import register_verifier
from .cpu import chain_speculative_sampling_cpu, chain_speculative_sampling_from_logits_cpu
from .reference import (chain_speculative_sampling_from_logits_reference,
                        chain_speculative_sampling_reference)


_launch = None


def _triton():
    # Imported on first use (importing triton is not free); read from the module at every call,
    # so that a replaced launcher (tests monkeypatch it) is the one called.
    global _launch
    if _launch is None:
        from . import launch as _launch
    return _launch.chain_speculative_sampling_triton


def _triton_from_logits():
    global _launch
    if _launch is None:
        from . import launch as _launch
    return _launch.chain_speculative_sampling_from_logits_triton


chain_speculative_sampling_op = register_verifier(
    "specops::chain_speculative_sampling",
    Backends(reference=chain_speculative_sampling_reference, cpu=chain_speculative_sampling_cpu,
             triton=_triton),
)

chain_speculative_sampling_from_logits_op = register_logits_verifier(
    "specops::chain_speculative_sampling_from_logits",
    Backends(reference=chain_speculative_sampling_from_logits_reference,
             cpu=chain_speculative_sampling_from_logits_cpu, triton=_triton_from_logits),
)
