"""The arguments of verification on a flattened batch, checked: the shapes, dtypes and devices
on every call (eager and at trace time alike, with no device read), the layout's values under
SPECOPS_VALIDATE=1 (docs/api.md, "Flattened batches"). Errors name the argument as the caller
called it."""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from ..chain.arguments import (INDEX_DTYPES, PROB_DTYPES, ArgumentNames, _check_counter,
                               _check_seed_like, check_counters_apart, check_values,
                               padded_rows_read)
from ..chain.from_logits import LogitsNames, check_logits_values
from ..core.logits import adjustments as step
from ..core.logits import parameters as params
from ..core.ops.checks import (device_error, dtype_error, dtype_name, first_bad_index,
                               require_tensor, shape)
from ..core.sampling.flattened import Padded


class Names(NamedTuple):
    """The names a caller gave the arguments."""

    chain: ArgumentNames = ArgumentNames()
    cu_num_draft_tokens: str = "cu_num_draft_tokens"
    max_num_draft_tokens: str = "max_num_draft_tokens"
    draft_logits: str = "draft_logits"


OP_NAMES = Names()
OP_LOGITS_NAMES = Names(ArgumentNames(target_probs="target_logits"))


def max_drafts(name: str, value) -> int:
    """max_num_draft_tokens as an int >= 0 (a SymInt under tracing passes as it is)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int >= 0; got {value!r}")
    if isinstance(value, torch.SymInt):
        return value
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 0 (the output's width less one, known without "
                        f"reading the device); got {type(value).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0; got {value}")
    return value


def check_layout(draft_probs, draft_token_ids, target, cu, max_num_draft_tokens, accepted_num,
                 emitted_num, seed, offset, names: Names, draft_logits=None,
                 logits: bool = False) -> int:
    """Shapes, dtypes, devices and the counters of a flattened batch: (T,) ids, (T + B, V) target
    rows, (B + 1,) cu, (T, V) draft rows; returns B. ``logits``: the target's rows are logits
    (the draft's probabilities may then have any dtype the ops take, and a counter may be None:
    the ops from logits take none)."""
    chain = names.chain
    require_tensor(chain.target_probs, target)
    if target.dim() != 2:
        raise ValueError(f"{chain.target_probs} must have shape (num_tokens + batch_size, "
                         f"vocab_size): every request's rows stacked; got {target.dim()}-D shape "
                         f"{shape(target)}")
    if target.dtype not in PROB_DTYPES:
        raise dtype_error(chain.target_probs, target, PROB_DTYPES)
    if target.shape[1] < 1:
        raise ValueError(f"{chain.target_probs} must have vocab_size >= 1; got {shape(target)}")
    device = target.device
    for name, index in ((chain.draft_token_ids, draft_token_ids),
                        (names.cu_num_draft_tokens, cu)):
        require_tensor(name, index)
        if index.dim() != 1:
            raise ValueError(f"{name} must be 1-D; got shape {shape(index)}")
        if index.dtype not in INDEX_DTYPES:
            raise dtype_error(name, index, INDEX_DTYPES)
        if index.device != device:
            raise device_error(name, index, device, chain.target_probs)
    if cu.shape[0] < 1:
        raise ValueError(f"{names.cu_num_draft_tokens} must have batch_size + 1 >= 1 elements "
                         f"(0 first, then each request's cumulative number of drafts); got shape "
                         f"{shape(cu)}")
    batch, num_tokens = cu.shape[0] - 1, draft_token_ids.shape[0]
    most = max_drafts(names.max_num_draft_tokens, max_num_draft_tokens)
    if target.shape[0] != num_tokens + batch:
        raise ValueError(
            f"{chain.target_probs} must have num_tokens + batch_size = {num_tokens} + {batch} = "
            f"{num_tokens + batch} rows (each request's drafts and bonus position, stacked), to "
            f"match {chain.draft_token_ids} {shape(draft_token_ids)} and "
            f"{names.cu_num_draft_tokens} {shape(cu)}; got {shape(target)}")
    if not isinstance(most, torch.SymInt) and num_tokens > batch * most:
        raise ValueError(
            f"{chain.draft_token_ids} holds {num_tokens} drafts, more than batch_size * "
            f"{names.max_num_draft_tokens} = {batch} * {most}: some request has more than "
            f"{names.max_num_draft_tokens} drafts")
    for name, draft in ((chain.draft_probs, draft_probs), (names.draft_logits, draft_logits)):
        if draft is None:
            continue
        require_tensor(name, draft)
        if draft.dim() != 2 or draft.shape[0] != num_tokens or draft.shape[1] != target.shape[1]:
            raise ValueError(f"{name} must have shape (num_tokens, vocab_size) = "
                             f"{(num_tokens, target.shape[1])} to match {chain.draft_token_ids} "
                             f"{shape(draft_token_ids)} and {chain.target_probs} "
                             f"{shape(target)}; got {shape(draft)}")
        if draft.dtype != target.dtype and (draft is draft_logits or not logits):
            raise TypeError(f"{name} must have the dtype of {chain.target_probs} "
                            f"({dtype_name(target.dtype)}); got {dtype_name(draft.dtype)}")
        if draft.dtype not in PROB_DTYPES:
            raise dtype_error(name, draft, PROB_DTYPES)
        if draft.device != device:
            raise device_error(name, draft, device, chain.target_probs)
    _check_counter(chain.accepted_num, accepted_num, batch, device, chain.target_probs, logits)
    _check_counter(chain.emitted_num, emitted_num, batch, device, chain.target_probs, logits)
    _check_seed_like(chain.seed, seed, batch, device, chain.target_probs)
    _check_seed_like(chain.offset, offset, batch, device, chain.target_probs)
    return batch


def check_logits_layout(draft_probs, draft_token_ids, target_logits, cu, max_num_draft_tokens,
                        draft_logits, accepted_num, emitted_num, seed, offset, parameters: dict,
                        names: Names, adjustments: step.Step = step.Step()) -> None:
    """``check_layout`` with logits in the target's place, the draft's one source, and the
    parameter tensors (1 or B values each)."""
    if draft_probs is not None and draft_logits is not None:
        raise ValueError(f"{names.draft_logits}: pass {names.chain.draft_probs} or "
                         f"{names.draft_logits}, not both: the drafts came from one distribution")
    batch = check_layout(draft_probs, draft_token_ids, target_logits, cu, max_num_draft_tokens,
                         accepted_num, emitted_num, seed, offset, names, draft_logits,
                         logits=True)
    params.check_parameters(parameters, batch, target_logits.device, names.chain.target_probs)
    params.check_draft_parameters_apply(parameters, draft_logits, names.draft_logits)
    step.check_adjustments(adjustments, batch, (target_logits.shape[0],),
                           target_logits.shape[-1], target_logits.device,
                           names.chain.target_probs, "num_tokens + batch_size")


def check_layout_values(draft_token_ids, cu, max_num_draft_tokens, names: Names) -> None:
    """SPECOPS_VALIDATE=1: cu starts at 0, never decreases, ends at T, and no request has more
    than max_num_draft_tokens drafts."""
    name, num_tokens = names.cu_num_draft_tokens, draft_token_ids.shape[0]
    if int(cu[0]) != 0:
        raise ValueError(f"{name} must start at 0; got {int(cu[0])} (SPECOPS_VALIDATE=1)")
    counts = cu[1:] - cu[:-1]
    where = first_bad_index(counts < 0)
    if where is not None:
        raise ValueError(f"{name} must not decrease; got {int(cu[where[0]])} then "
                         f"{int(cu[where[0] + 1])} at index {where[0]} (SPECOPS_VALIDATE=1)")
    where = first_bad_index(counts > max_num_draft_tokens)
    if where is not None:
        raise ValueError(f"request {where[0]} has {int(counts[where])} drafts ({name}), more "
                         f"than {names.max_num_draft_tokens} = {max_num_draft_tokens} "
                         f"(SPECOPS_VALIDATE=1)")
    if int(cu[-1]) != num_tokens:
        raise ValueError(f"{name} must end at num_tokens = {num_tokens}, the drafts in "
                         f"{names.chain.draft_token_ids}; got {int(cu[-1])} (SPECOPS_VALIDATE=1)")


# The registered ops' schemas and checks: the padded ops' arguments with the layout after the
# target's rows (``core.ops.registry.register_op`` takes them).
SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, "
    "Tensor cu_num_draft_tokens, SymInt max_num_draft_tokens, Tensor(a!) accepted_num, "
    "Tensor(b!) emitted_num, Tensor seed, Tensor offset) -> Tensor"
)
LOGITS_SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_logits, "
    "Tensor cu_num_draft_tokens, SymInt max_num_draft_tokens, Tensor? draft_logits, "
    "Tensor seed, Tensor offset, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, "
    f"{params.DRAFT_SCHEMA}, {step.SCHEMA}) -> (Tensor, Tensor, Tensor)"
)
MUTATES_ARGS = ("accepted_num", "emitted_num")
# The ops from logits return this call's counts: their backends take the two counters after
# draft_logits.
COUNTS_AT = 6


def check(draft_probs, draft_token_ids, target_probs, cu, max_num_draft_tokens, accepted_num,
          emitted_num, seed, offset) -> None:
    check_layout(draft_probs, draft_token_ids, target_probs, cu, max_num_draft_tokens,
                 accepted_num, emitted_num, seed, offset, OP_NAMES)
    check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num)


def check_op_values(draft_probs, draft_token_ids, target_probs, cu, max_num_draft_tokens,
                    *rest) -> None:
    check_layout_values(draft_token_ids, cu, max_num_draft_tokens, OP_NAMES)
    check_values(draft_probs, draft_token_ids, target_probs,
                 rows_read=rows_read(draft_token_ids, cu, max_num_draft_tokens, target_probs))


def check_logits(draft_probs, draft_token_ids, target_logits, cu, max_num_draft_tokens,
                 draft_logits, seed, offset, *rest) -> None:
    parameters, given, order = step.split_trailing(rest)
    check_logits_layout(draft_probs, draft_token_ids, target_logits, cu, max_num_draft_tokens,
                        draft_logits, None, None, seed, offset, params.named(*parameters),
                        OP_LOGITS_NAMES, given)
    step.check_order(order)


def check_logits_op_values(draft_probs, draft_token_ids, target_logits, cu, max_num_draft_tokens,
                           draft_logits, seed, offset, *rest) -> None:
    parameters, given, _ = step.split_trailing(rest)
    check_layout_values(draft_token_ids, cu, max_num_draft_tokens, OP_LOGITS_NAMES)
    check_logits_values(draft_probs, draft_token_ids, target_logits, draft_logits,
                        params.named(*parameters), LogitsNames(), adjustments=given,
                        rows_read=rows_read(draft_token_ids, cu, max_num_draft_tokens,
                                            target_logits))


def rows_read(draft_token_ids, cu, max_num_draft_tokens, target):
    """(target's (T + B,), draft's (T,)) bool: the flattened rows the op may read (a valid
    layout's), those of the padded batch they stand for (``chain.arguments.padded_rows_read``)."""
    padded = Padded(cu, draft_token_ids.shape[0], max_num_draft_tokens)
    target_read, draft_read = padded_rows_read(padded.ids(draft_token_ids), target.shape[-1])
    flat_target = torch.zeros(target.shape[0], dtype=torch.bool, device=target.device)
    flat_draft = torch.zeros(draft_token_ids.shape[0], dtype=torch.bool, device=target.device)
    flat_target[padded.target_rows[target_read]] = True
    flat_draft[padded.draft_rows[draft_read]] = True
    return flat_target, flat_draft


def outputs(draft_probs, draft_token_ids, target, cu, max_num_draft_tokens, *rest):
    """output_token_ids, empty: (B, max_num_draft_tokens + 1) int32: its width from the int, so
    one graph serves every mix of lengths."""
    return target.new_empty((cu.shape[0] - 1, max_num_draft_tokens + 1), dtype=torch.int32)


def batch_size(draft_probs, draft_token_ids, target, cu, *rest) -> int:
    return cu.shape[0] - 1


def logits_outputs(draft_probs, draft_token_ids, target, cu, max_num_draft_tokens, *rest):
    """``outputs`` and this call's counts accepted, emitted (B,), empty, int32."""
    return (outputs(draft_probs, draft_token_ids, target, cu, max_num_draft_tokens),
            *(target.new_empty(cu.shape[0] - 1, dtype=torch.int32) for _ in range(2)))
