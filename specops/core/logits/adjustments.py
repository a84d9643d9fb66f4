"""The target's grammar mask, logit bias and penalties as the registered ops take them (rule step
0, ``rule.adjusted_logits``): their argument checks and SPECOPS_VALIDATE=1 value checks, errors
naming the argument."""

from __future__ import annotations

import torch

from ..ops.checks import device_error, dtype_error, first_bad_index, require_tensor, shape
from . import parameters as params
from .rule import BITS, ORDERS, Step, optional_arguments

BIAS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BITMASK_DTYPES = (torch.int32,)
COUNT_DTYPES = (torch.int32, torch.int64)
# The registered ops take them after the draft's parameters, each None (off) by default, then
# the order of the sampling parameters' steps.
SCHEMA = ", ".join(f"Tensor? {name}=None" for name in Step._fields) + \
    ', str processing_order="vllm"'


def split_trailing(rest: tuple) -> tuple[tuple, Step, str]:
    """A from-logits op's arguments from its temperature on: (the eight parameter tensors, the
    target's four then the draft's, as ``parameters.named`` takes them; the Step; the processing
    order), defaults where the dispatcher left them out."""
    draft, step, order, _ = optional_arguments(rest[4:])
    return tuple(rest[:4]) + draft, step, order


def check_order(processing_order) -> None:
    """``processing_order``: one of ``rule.ORDERS``."""
    if not isinstance(processing_order, str) or processing_order not in ORDERS:
        raise ValueError(f'processing_order must be "vllm" or "transformers" (min-p after top-k '
                         f"and top-p); got {processing_order!r}")


def words(vocab: int) -> int:
    """Words of a bitmask row: ceil(V / 32)."""
    return -(-vocab // BITS)


def _check_tensor(name, t, expected: tuple, dtypes, device, reference, shape_text) -> None:
    require_tensor(name, t)
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape ({shape_text}) = {expected} to match "
                         f"{reference}; got {shape(t)}")
    if t.dtype not in dtypes:
        raise dtype_error(name, t, dtypes)
    if t.device != device:
        raise device_error(name, t, device, reference)


def check_adjustments(step: Step, batch: int, rows: tuple, vocab: int, device: torch.device,
                      reference: str, rows_text: str) -> None:
    """The Step's tensors: the bias and the output's counts and prompt mask (B, V), the bitmask
    (*rows, ceil(V / 32)) (rows: the target's rows' leading shape, ``rows_text`` its words), the
    penalties 1 or B values (as the sampling parameters), all on ``device``; the counts given
    wherever a penalty is."""
    per_request = (batch, vocab)
    if step.logit_bias is not None:
        _check_tensor("logit_bias", step.logit_bias, per_request, BIAS_DTYPES, device, reference,
                      "batch_size, vocab_size")
    if step.allowed_token_bitmask is not None:
        _check_tensor("allowed_token_bitmask", step.allowed_token_bitmask,
                      (*rows, words(vocab)), BITMASK_DTYPES, device, reference,
                      f"{rows_text}, ceil(vocab_size / 32)")
    penalties = {name: getattr(step, name) for name in params.PENALTIES}
    params.check_parameters(penalties, batch, device, reference)
    if step.output_token_counts is not None:
        _check_tensor("output_token_counts", step.output_token_counts, per_request,
                      COUNT_DTYPES, device, reference, "batch_size, vocab_size")
    elif any(value is not None for value in penalties.values()):
        raise ValueError("output_token_counts must be given with a penalty: (batch_size, "
                         "vocab_size) counts of each token generated so far")
    if step.prompt_token_mask is not None:
        _check_tensor("prompt_token_mask", step.prompt_token_mask, per_request, (torch.bool,),
                      device, reference, "batch_size, vocab_size")


def check_adjustment_values(step: Step) -> None:
    """SPECOPS_VALIDATE=1: a bias is a number or -inf (a ban), NaN and +inf refused; penalties in
    their ranges; counts >= 0."""
    if step.logit_bias is not None:
        where = first_bad_index(torch.isnan(step.logit_bias) | (step.logit_bias == torch.inf))
        if where is not None:
            raise ValueError(f"logit_bias must be a number or -inf; got "
                             f"{float(step.logit_bias[where])} at index {where} "
                             "(SPECOPS_VALIDATE=1)")
    params.check_parameter_values({name: getattr(step, name) for name in params.PENALTIES})
    if step.output_token_counts is not None:
        where = first_bad_index(step.output_token_counts < 0)
        if where is not None:
            raise ValueError(f"output_token_counts must be >= 0; got "
                             f"{int(step.output_token_counts[where])} at index {where} "
                             "(SPECOPS_VALIDATE=1)")


def as_step(device: torch.device, logit_bias=None, allowed_token_bitmask=None,
            repetition_penalty=None, frequency_penalty=None, presence_penalty=None,
            output_token_counts=None, prompt_token_mask=None) -> Step:
    """A public function's Step: the penalties given as numbers made into the op's tensors
    (``parameters.as_penalties``), the rest as given."""
    penalties = params.as_penalties(device, repetition_penalty, frequency_penalty,
                                    presence_penalty)
    return Step(logit_bias, allowed_token_bitmask, *penalties, output_token_counts,
                prompt_token_mask)
