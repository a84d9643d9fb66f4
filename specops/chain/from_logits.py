"""Verifiers of a chain of drafts from logits: token and block verification of the distributions
each request's sampling parameters make of the target's logits (core/logits/rule.py): the schema,
argument check, value check and fake's outputs their registered ops share
(``core.ops.registry.register_op``).

The drafts come from ``draft_probs`` as given, from ``draft_logits`` processed with the draft's
parameters (by default the target's), or greedily (neither: one-hot drafts).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.logits import adjustments as step
from ..core.logits import parameters as params
from ..core.ops.checks import (device_error, dtype_error, dtype_name, first_bad_index,
                               require_tensor, shape)
from .arguments import PROB_DTYPES, ArgumentNames, check_arguments, check_values

SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_logits, Tensor? draft_logits, "
    "Tensor seed, Tensor offset, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, "
    f"{params.DRAFT_SCHEMA}, {step.SCHEMA}) -> (Tensor, Tensor, Tensor)"
)


class LogitsNames(NamedTuple):
    """The names a caller gave the checked tensors."""

    chain: ArgumentNames = ArgumentNames(target_probs="target_logits")
    draft_logits: str = "draft_logits"


OP_NAMES = LogitsNames()


def check_logits_arguments(draft_probs, draft_token_ids, target_logits, draft_logits,
                           accepted_num, emitted_num, seed, offset, parameters: dict,
                           names: LogitsNames = OP_NAMES,
                           adjustments: step.Step = step.Step()) -> None:
    """Shapes, dtypes and devices (the chain ops' checks, with the logits in the target's place;
    a counter may be None), the draft's one source, and the parameter tensors; errors name the
    argument."""
    check_arguments(draft_probs=None, draft_token_ids=draft_token_ids,
                    target_probs=target_logits, accepted_num=accepted_num,
                    emitted_num=emitted_num, seed=seed, offset=offset, names=names.chain,
                    counters_optional=True)
    batch, positions, vocab = target_logits.shape
    device = target_logits.device
    if draft_probs is not None and draft_logits is not None:
        raise ValueError(f"{names.draft_logits}: pass {names.chain.draft_probs} or "
                         f"{names.draft_logits}, not both: the drafts came from one distribution")
    for name, draft in ((names.chain.draft_probs, draft_probs),
                        (names.draft_logits, draft_logits)):
        if draft is None:
            continue
        require_tensor(name, draft)
        if tuple(draft.shape) != (batch, positions - 1, vocab):
            raise ValueError(f"{name} must have shape (batch_size, num_speculate_tokens, "
                             f"vocab_size) = {(batch, positions - 1, vocab)} to match "
                             f"{names.chain.target_probs} {shape(target_logits)}; got "
                             f"{shape(draft)}")
        if draft.dtype not in PROB_DTYPES:
            raise dtype_error(name, draft, PROB_DTYPES)
        if draft is draft_logits and draft.dtype != target_logits.dtype:
            raise TypeError(f"{name} must have the dtype of {names.chain.target_probs} "
                            f"({dtype_name(target_logits.dtype)}); got {dtype_name(draft.dtype)}")
        if draft.device != device:
            raise device_error(name, draft, device, names.chain.target_probs)
    params.check_parameters(parameters, batch, device, names.chain.target_probs)
    params.check_draft_parameters_apply(parameters, draft_logits, names.draft_logits)
    step.check_adjustments(adjustments, batch, (batch, positions), vocab, device,
                           names.chain.target_probs, "batch_size, num_speculate_tokens + 1")


def check_logits_values(draft_probs, draft_token_ids, target_logits, draft_logits,
                        parameters: dict, names: LogitsNames = OP_NAMES,
                        vocab: int | None = None, rows_read=None,
                        adjustments: step.Step = step.Step()) -> None:
    """SPECOPS_VALIDATE=1: the chain ops' id and draft-probability checks, logits that are NaN or
    +inf (-inf, the usual mask, is a logit like any other), parameters out of range. vocab and
    rows_read: as in ``check_values``."""
    check_values(draft_probs, draft_token_ids, target_logits, names.chain, probabilities=False,
                 vocab=vocab, rows_read=rows_read)
    for name, logits in ((names.chain.target_probs, target_logits),
                         (names.draft_logits, draft_logits)):
        if logits is None:
            continue
        where = first_bad_index(torch.isnan(logits) | (logits == torch.inf))
        if where is not None:
            raise ValueError(f"{name} must be a number or -inf; got {float(logits[where])} at "
                             f"index {where} (SPECOPS_VALIDATE=1)")
    params.check_parameter_values(parameters)
    step.check_adjustment_values(adjustments)


def check(draft_probs, draft_token_ids, target_logits, draft_logits, seed, offset, *rest) -> None:
    """The registered op's argument check (``check_logits_arguments``); errors name the schema's
    arguments."""
    parameters, given, order = step.split_trailing(rest)
    check_logits_arguments(draft_probs, draft_token_ids, target_logits, draft_logits, None, None,
                           seed, offset, params.named(*parameters), adjustments=given)
    step.check_order(order)


def check_op_values(draft_probs, draft_token_ids, target_logits, draft_logits, seed, offset,
                    *rest) -> None:
    """The registered op's SPECOPS_VALIDATE=1 check (``check_logits_values``)."""
    parameters, given, _ = step.split_trailing(rest)
    check_logits_values(draft_probs, draft_token_ids, target_logits, draft_logits,
                        params.named(*parameters), adjustments=given)


# The op returns this call's counts: its backends take the two counters after draft_logits.
COUNTS_AT = 4


def batch_size(draft_probs, draft_token_ids, *rest) -> int:
    return draft_token_ids.shape[0]


def outputs(draft_probs, draft_token_ids, target_logits, *rest):
    """output_token_ids (B, N + 1) and this call's counts accepted, emitted (B,), empty, int32."""
    batch, num_draft = draft_token_ids.shape
    return (target_logits.new_empty((batch, num_draft + 1), dtype=torch.int32),
            *(target_logits.new_empty(batch, dtype=torch.int32) for _ in range(2)))
