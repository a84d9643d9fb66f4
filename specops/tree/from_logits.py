"""Tree verification from logits: the tree rules (docs/tree.md) on the distributions each
request's sampling parameters make of the target's logits (core/logits/rule.py), and of the
draft's when they are given as logits (by the draft's own parameters, by default the target's):
the schema and checks of its registered op (tree/op.py), whose outputs are the tree op's. Every
backend processes the rows, then verifies them as the tree op does (tree/processed.py)."""

from __future__ import annotations

from ..core.logits import adjustments as step
from ..core.logits import parameters as params
from ..core.logits.rule import optional_arguments
from ..core.ops.checks import device_error, dtype_error, dtype_name, require_tensor, shape
from . import arguments

SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor parents, Tensor target_logits, "
    "Tensor? draft_logits, Tensor seed, Tensor offset, Tensor temperature, Tensor top_k, "
    "Tensor top_p, Tensor min_p, bool with_replacement=True, "
    f"{params.DRAFT_SCHEMA}, {step.SCHEMA}, str verification=\"token\") "
    "-> (Tensor, Tensor, Tensor)"
)


def verification_of(rest: tuple) -> str:
    """The ``verification`` among the op's arguments after with_replacement (the last; the
    dispatcher may leave it out at its default)."""
    trailing = optional_arguments(rest)[3]
    return trailing[0] if trailing else "token"


def check(draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed, offset,
          temperature, top_k, top_p, min_p, with_replacement=True, *rest) -> None:
    """The tree op's checks with the logits in target_probs' place, the draft's one source, and
    the parameter tensors; errors name the argument."""
    arguments.check_arguments(None, draft_token_ids, parents, target_logits, seed, offset,
                              with_replacement, target_name="target_logits")
    if draft_probs is not None and draft_logits is not None:
        raise ValueError("draft_logits: pass draft_probs or draft_logits, not both: the drafts "
                         "came from one distribution")
    for name, draft in (("draft_probs", draft_probs), ("draft_logits", draft_logits)):
        if draft is None:
            continue
        require_tensor(name, draft)
        if draft.shape != target_logits.shape:
            raise ValueError(f"{name} must have shape (batch_size, num_nodes + 1, vocab_size) = "
                             f"{shape(target_logits)}, the shape of target_logits; got "
                             f"{shape(draft)}")
        if draft.dtype not in arguments.PROB_DTYPES:
            raise dtype_error(name, draft, arguments.PROB_DTYPES)
        if draft is draft_logits and draft.dtype != target_logits.dtype:
            raise TypeError(f"{name} must have the dtype of target_logits "
                            f"({dtype_name(target_logits.dtype)}); got {dtype_name(draft.dtype)}")
        if draft.device != target_logits.device:
            raise device_error(name, draft, target_logits.device, "target_logits")
    draft_parameters, given, order = step.split_trailing((None,) * 4 + rest)
    step.check_order(order)
    arguments.check_verification(verification_of(rest))
    parameters = params.named(temperature, top_k, top_p, min_p, *draft_parameters[4:])
    params.check_parameters(parameters, target_logits.shape[0], target_logits.device,
                            "target_logits")
    params.check_draft_parameters_apply(parameters, draft_logits, "draft_logits")
    batch, nodes, vocab = target_logits.shape
    step.check_adjustments(given, batch, (batch, nodes), vocab, target_logits.device,
                           "target_logits", "batch_size, num_nodes + 1")


def check_values(draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed,
                 offset, temperature, top_k, top_p, min_p, with_replacement=True,
                 *rest) -> None:
    """SPECOPS_VALIDATE=1: the tree op's id, parent and draft-probability checks, NaN or +inf
    logits in the rows the op reads, parameters out of range, a logit bias NaN or +inf."""
    arguments.check_values(draft_probs, draft_token_ids, parents, target_logits,
                           logits=(target_logits, draft_logits))
    draft_parameters, given, _ = step.split_trailing((None,) * 4 + rest)
    params.check_parameter_values(params.named(temperature, top_k, top_p, min_p,
                                               *draft_parameters[4:]))
    step.check_adjustment_values(given)
