"""Token and block verification of a flattened batch, and their from-logits twins, registered as
torch ops: the references and CPU backends verify the padded batch the layout stands for
(layout.py); the Triton launchers read the flattened rows where they are."""

from __future__ import annotations

from ..chain.block.cpu import (block_speculative_sampling_cpu,
                               block_speculative_sampling_from_logits_cpu)
from ..chain.block.reference import (block_speculative_sampling_from_logits_reference,
                                     block_speculative_sampling_reference)
from ..chain.rows import Flattened
from ..chain.token.cpu import (chain_speculative_sampling_cpu,
                               chain_speculative_sampling_from_logits_cpu)
from ..chain.token.reference import (chain_speculative_sampling_from_logits_reference,
                                     chain_speculative_sampling_reference)
from ..core.ops.registry import Backends, imported_on_first_use, register_op
from .arguments import (COUNTS_AT, LOGITS_SCHEMA, MUTATES_ARGS, SCHEMA, batch_size, check,
                        check_logits, check_logits_op_values, check_op_values, logits_outputs,
                        outputs)
from .layout import on_padded_batch


def _flattened(module: str, name: str):
    """A ``Backends.triton``: the padded launcher ``name`` of ``module``, given the layout."""
    launcher = imported_on_first_use(module, name)

    def backend():
        launch = launcher()

        def run(draft_probs, draft_token_ids, target, cu, max_num_draft_tokens, *rest):
            return launch(draft_probs, draft_token_ids, target, *rest,
                          flattened=Flattened(cu, max_num_draft_tokens))
        return run
    return backend


def _register(qualname, reference, cpu, module, launcher, logits):
    return register_op(
        qualname, LOGITS_SCHEMA if logits else SCHEMA,
        check=check_logits if logits else check,
        check_values=check_logits_op_values if logits else check_op_values,
        outputs=logits_outputs if logits else outputs,
        mutates_args=() if logits else MUTATES_ARGS,
        counts=(COUNTS_AT, batch_size) if logits else None,
        backends=Backends(reference=on_padded_batch(reference, logits),
                          cpu=on_padded_batch(cpu, logits),
                          triton=_flattened(module, launcher)))


_TOKEN, _BLOCK = "specops.chain.token.launch", "specops.chain.block.launch"

varlen_chain_speculative_sampling_op = _register(
    "specops::varlen_chain_speculative_sampling", chain_speculative_sampling_reference,
    chain_speculative_sampling_cpu, _TOKEN, "chain_speculative_sampling_triton", False)
varlen_chain_block_speculative_sampling_op = _register(
    "specops::varlen_chain_block_speculative_sampling", block_speculative_sampling_reference,
    block_speculative_sampling_cpu, _BLOCK, "block_speculative_sampling_triton", False)
varlen_chain_speculative_sampling_from_logits_op = _register(
    "specops::varlen_chain_speculative_sampling_from_logits",
    chain_speculative_sampling_from_logits_reference, chain_speculative_sampling_from_logits_cpu,
    _TOKEN, "chain_speculative_sampling_from_logits_triton", True)
varlen_chain_block_speculative_sampling_from_logits_op = _register(
    "specops::varlen_chain_block_speculative_sampling_from_logits",
    block_speculative_sampling_from_logits_reference, block_speculative_sampling_from_logits_cpu,
    _BLOCK, "block_speculative_sampling_from_logits_triton", True)
