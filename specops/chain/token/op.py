"""``torch.ops.specops.chain_speculative_sampling`` (token verification) and its from-logits twin,
registered as torch ops."""

from __future__ import annotations

from ...core.ops.registry import Backends, imported_on_first_use, register_op
from .. import from_logits, verifier
from .cpu import chain_speculative_sampling_cpu, chain_speculative_sampling_from_logits_cpu
from .reference import (chain_speculative_sampling_from_logits_reference,
                        chain_speculative_sampling_reference)


_LAUNCH = f"{__package__}.launch"  # its Triton launchers, imported on first use


chain_speculative_sampling_op = register_op(
    "specops::chain_speculative_sampling", verifier.SCHEMA,
    check=verifier.check, check_values=verifier.check_op_values, outputs=verifier.outputs,
    mutates_args=verifier.MUTATES_ARGS, backend_arguments=verifier.BACKEND_ARGUMENTS,
    backends=Backends(reference=chain_speculative_sampling_reference,
                      cpu=chain_speculative_sampling_cpu,
                      triton=imported_on_first_use(_LAUNCH, "chain_speculative_sampling_triton")),
)

chain_speculative_sampling_from_logits_op = register_op(
    "specops::chain_speculative_sampling_from_logits", from_logits.SCHEMA,
    check=from_logits.check, check_values=from_logits.check_op_values,
    outputs=from_logits.outputs, counts=(from_logits.COUNTS_AT, from_logits.batch_size),
    backends=Backends(reference=chain_speculative_sampling_from_logits_reference,
                      cpu=chain_speculative_sampling_from_logits_cpu,
                      triton=imported_on_first_use(
                          _LAUNCH, "chain_speculative_sampling_from_logits_triton")),
)
