"""``torch.ops.specops.chain_speculative_sampling`` (token verification) and its from-logits twin,
registered as torch ops."""

from __future__ import annotations

from ...core.ops.registry import Backends, register_op
from .. import from_logits, verifier
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


chain_speculative_sampling_op = register_op(
    "specops::chain_speculative_sampling", verifier.SCHEMA,
    check=verifier.check, check_values=verifier.check_op_values, outputs=verifier.outputs,
    mutates_args=verifier.MUTATES_ARGS, backend_arguments=verifier.BACKEND_ARGUMENTS,
    backends=Backends(reference=chain_speculative_sampling_reference,
                      cpu=chain_speculative_sampling_cpu, triton=_triton),
)

chain_speculative_sampling_from_logits_op = register_op(
    "specops::chain_speculative_sampling_from_logits", from_logits.SCHEMA,
    check=from_logits.check, check_values=from_logits.check_op_values,
    outputs=from_logits.outputs, mutates_args=from_logits.MUTATES_ARGS,
    backends=Backends(reference=chain_speculative_sampling_from_logits_reference,
                      cpu=chain_speculative_sampling_from_logits_cpu, triton=_triton_from_logits),
)
