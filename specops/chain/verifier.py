"""What a chain verifier's registered op is made of: token and block verification take the same
arguments and return output_token_ids (B, N + 1) int32, so they share one schema, one argument
check, one value check and one fake's outputs (``core.ops.registry.register_op`` takes them).
"""

from __future__ import annotations

import torch

from .arguments import check_arguments, check_counters_apart, check_values

# Spelled out rather than inferred: the inferred schema would name the aliases a3!/a4!.
# `deterministic` is accepted for FlashInfer compatibility: every backend is reproducible.
SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, "
    "Tensor(a!) accepted_num, Tensor(b!) emitted_num, Tensor seed, Tensor offset, "
    "bool deterministic=True) -> Tensor"
)
MUTATES_ARGS = ("accepted_num", "emitted_num")
# The backends take the seven tensor arguments (no backend reads `deterministic`).
BACKEND_ARGUMENTS = 7


def check(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
          deterministic=True) -> None:
    """Shapes, dtypes, devices, and counters apart; errors name the schema's arguments."""
    check_arguments(draft_probs=draft_probs, draft_token_ids=draft_token_ids,
                    target_probs=target_probs, accepted_num=accepted_num,
                    emitted_num=emitted_num, seed=seed, offset=offset)
    check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num)


def check_op_values(draft_probs, draft_token_ids, target_probs, *rest) -> None:
    """SPECOPS_VALIDATE=1: ids and probabilities (``arguments.check_values``)."""
    check_values(draft_probs, draft_token_ids, target_probs)


def outputs(draft_probs, draft_token_ids, target_probs, *rest) -> torch.Tensor:
    """output_token_ids, empty: (B, N + 1) int32."""
    batch, num_draft = draft_token_ids.shape
    return target_probs.new_empty((batch, num_draft + 1), dtype=torch.int32)
