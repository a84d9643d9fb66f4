"""``torch.ops.specops.tree_speculative_sampling``: tree verification, and its from-logits twin,
registered as torch ops."""

from __future__ import annotations

import torch

from ..core.ops.registry import Backends, imported_on_first_use, register_op
from . import from_logits
from .arguments import check_arguments, check_values, check_verification
from .cpu import tree_speculative_sampling_cpu, tree_speculative_sampling_from_logits_cpu
from .processed import on_processed_rows
from .reference import tree_speculative_sampling_reference
from .traversal_reference import verify as traversal_reference

# Spelled out rather than inferred, so that the schema names its arguments as docs/api.md does.
SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor parents, Tensor target_probs, "
    "Tensor seed, Tensor offset, bool with_replacement=True, str verification=\"token\") "
    "-> (Tensor, Tensor, Tensor)"
)

_LAUNCH = f"{__package__}.launch"  # its Triton launchers, imported on first use


def _reference(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
               with_replacement=True, verification="token"):
    """The reference backend of either rule: traversal verification where asked for with draft
    probabilities, the token rule otherwise (target-only they are one rule: docs/tree.md). The
    CPU backend and the Triton launcher choose the same way."""
    rule = (traversal_reference if verification == "traversal" and draft_probs is not None
            else tree_speculative_sampling_reference)
    return rule(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                with_replacement)


def _check(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
           with_replacement=True, verification="token"):
    check_arguments(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                    with_replacement)
    check_verification(verification)


def _check_values(draft_probs, draft_token_ids, parents, target_probs, *rest):
    check_values(draft_probs, draft_token_ids, parents, target_probs)


def _outputs(draft_probs, draft_token_ids, parents, target_probs, *rest):
    """(output_token_ids (B, M + 1), output_node_ids (B, M), emitted (B,)), int32, empty."""
    batch, num_nodes = draft_token_ids.shape
    return (target_probs.new_empty((batch, num_nodes + 1), dtype=torch.int32),
            target_probs.new_empty((batch, num_nodes), dtype=torch.int32),
            target_probs.new_empty((batch,), dtype=torch.int32))


tree_speculative_sampling_op = register_op(
    "specops::tree_speculative_sampling", SCHEMA, check=_check, check_values=_check_values,
    outputs=_outputs,
    backends=Backends(reference=_reference,
                      cpu=tree_speculative_sampling_cpu,
                      triton=imported_on_first_use(_LAUNCH, "tree_speculative_sampling_triton")),
)

tree_speculative_sampling_from_logits_op = register_op(
    "specops::tree_speculative_sampling_from_logits", from_logits.SCHEMA, check=from_logits.check,
    check_values=from_logits.check_values, outputs=_outputs,  # the tree op's: same leading args
    backends=Backends(reference=on_processed_rows(_reference),
                      cpu=tree_speculative_sampling_from_logits_cpu,
                      triton=imported_on_first_use(
                          _LAUNCH, "tree_speculative_sampling_from_logits_triton")),
)
