"""``torch.ops.specops.token_logprobs``: the log-probabilities of tokens of rows of logits under
each request's sampling parameters, the most likely tokens (docs/semantics.md, "Logprobs") and,
asked for, each row's entropy (which typical acceptance reads, chain/lossy.py), registered as a
torch op. The public verifiers call it after the verification op when a caller asks for
logprobs (``outputs.py``, and each layout's ``logprobs.py``)."""

from __future__ import annotations

import torch

from ..logits import adjustments as step
from ..logits import parameters as params
from ..logits.rule import Step
from ..ops.checks import device_error, dtype_error, require_tensor, shape
from ..ops.registry import Backends, imported_on_first_use, register_op
from .cpu import token_logprobs_cpu
from .rule import token_logprobs_reference

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ID_DTYPES = (torch.int32, torch.int64)
# Rule step 0's inputs last, as the verifiers from logits take them, after what each row counts
# as generated and a flattened batch's layout (rule.requests_rows).
STEP_INPUTS = ("generated_ids", "cu_num_draft_tokens", *Step._fields)
SCHEMA = ("(Tensor logits, Tensor token_ids, Tensor temperature, Tensor top_k, Tensor top_p, "
          'Tensor min_p, int num_top=0, str processing_order="vllm", bool entropy=False, '
          + ", ".join(f"Tensor? {name}=None" for name in STEP_INPUTS)
          + ") -> (Tensor, Tensor, Tensor, Tensor)")


def check_rows(logits, temperature, top_k, top_p, min_p, processing_order="vllm",
               batch: int | None = None) -> None:
    """logits (B, P, V), the parameters 1 or B values (B: ``batch`` where given) on its device,
    the order; errors name the argument."""
    require_tensor("logits", logits)
    if logits.dim() != 3 or logits.shape[-1] < 1:
        raise ValueError("logits must have shape (batch_size, positions, vocab_size) with "
                         f"vocab_size >= 1; got {shape(logits)}")
    if logits.dtype not in LOGITS_DTYPES:
        raise dtype_error("logits", logits, LOGITS_DTYPES)
    params.check_parameters(params.named(temperature, top_k, top_p, min_p),
                            logits.shape[0] if batch is None else batch, logits.device, "logits")
    step.check_order(processing_order)


def check(logits, token_ids, temperature, top_k, top_p, min_p, num_top=0,
          processing_order="vllm", entropy=False, generated_ids=None, cu_num_draft_tokens=None,
          *step_inputs) -> None:
    """Padded: ``check_rows``, token_ids (B, P) or (B, P, K), generated_ids None or (B, P, L).
    Flattened (cu_num_draft_tokens given): logits (T + B, V), token_ids (B, P) or (B, P, K), cu
    (B + 1,), generated_ids (T,). Then rule step 0's inputs and num_top in [0, V]."""
    require_tensor("token_ids", token_ids)
    if token_ids.dim() not in (2, 3):
        raise ValueError(f"token_ids must have shape (batch_size, positions) or (batch_size, "
                         f"positions, tokens a row); got {shape(token_ids)}")
    if token_ids.dtype not in ID_DTYPES:
        raise dtype_error("token_ids", token_ids, ID_DTYPES)
    batch, positions = token_ids.shape[:2]
    flattened = cu_num_draft_tokens is not None
    if flattened:  # the rows as the padded rows they stand for
        require_tensor("logits", logits)
        if positions < 1:
            raise ValueError(f"token_ids must have max_num_draft_tokens + 1 >= 1 columns with "
                             f"cu_num_draft_tokens; got {shape(token_ids)}")
        if logits.dim() != 2 or logits.shape[0] < batch or logits.shape[1] < 1:
            raise ValueError(f"logits must have shape (num_tokens + batch_size, vocab_size) with "
                             f"cu_num_draft_tokens, batch_size = {batch} from token_ids; got "
                             f"{shape(logits)}")
        check_rows(logits[None], temperature, top_k, top_p, min_p, processing_order, batch)
        check_ids("cu_num_draft_tokens", cu_num_draft_tokens, (batch + 1,), logits.device)
        check_ids("generated_ids", generated_ids, (logits.shape[0] - batch,), logits.device)
    else:
        check_rows(logits, temperature, top_k, top_p, min_p, processing_order)
        if tuple(token_ids.shape[:2]) != tuple(logits.shape[:2]):
            raise ValueError(f"token_ids must have shape (batch_size, positions, ...) with "
                             f"(batch_size, positions) = {tuple(logits.shape[:2])} to match logits "
                             f"{shape(logits)}; got {shape(token_ids)}")
        if generated_ids is not None:
            require_tensor("generated_ids", generated_ids)
            if generated_ids.dim() != 3 or tuple(generated_ids.shape[:2]) != (batch, positions):
                raise ValueError(f"generated_ids must have shape (batch_size, positions, L) with "
                                 f"(batch_size, positions) = {(batch, positions)}; got "
                                 f"{shape(generated_ids)}")
            check_ids("generated_ids", generated_ids, tuple(generated_ids.shape), logits.device)
    if token_ids.device != logits.device:
        raise device_error("token_ids", token_ids, logits.device, "logits")
    vocab = logits.shape[-1]
    rows = (logits.shape[0],) if flattened else (batch, positions)
    step.check_adjustments(Step(*step_inputs), batch, rows, vocab, logits.device, "logits",
                           "num_tokens + batch_size" if flattened else "batch_size, positions")
    check_num_top("num_top", num_top, vocab)


def check_ids(name: str, ids, expected: tuple, device) -> None:
    """Token ids or a layout's cumulative counts: int32/int64 of the expected shape on the
    logits' device."""
    require_tensor(name, ids)
    if tuple(ids.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}; got {shape(ids)}")
    if ids.dtype not in ID_DTYPES:
        raise dtype_error(name, ids, ID_DTYPES)
    if ids.device != device:
        raise device_error(name, ids, device, "logits")


def check_num_top(name: str, num_top, vocab: int) -> None:
    """The number of most likely tokens asked for: an int in [0, V]."""
    if isinstance(num_top, bool) or not isinstance(num_top, int) or not 0 <= num_top <= vocab:
        raise ValueError(f"{name} must be an int in [0, vocab_size = {vocab}]; got {num_top!r}")


def check_values(logits, token_ids, temperature, top_k, top_p, min_p, num_top=0,
                 processing_order="vllm", entropy=False, generated_ids=None,
                 cu_num_draft_tokens=None, *step_inputs) -> None:
    """SPECOPS_VALIDATE=1: parameters and rule step 0's inputs out of range."""
    params.check_parameter_values(params.named(temperature, top_k, top_p, min_p))
    step.check_adjustment_values(Step(*step_inputs))


def outputs(logits, token_ids, temperature, top_k, top_p, min_p, num_top=0,
            processing_order="vllm", entropy=False, *rest):
    """(logprobs float32 shaped as token_ids, top ids (B, P, num_top) int32, their logprobs
    float32, the rows' entropies (B, P) float32, (B, 0) unless asked for), empty."""
    batch, positions = token_ids.shape[:2]
    return (logits.new_empty(token_ids.shape, dtype=torch.float32),
            logits.new_empty((batch, positions, num_top), dtype=torch.int32),
            logits.new_empty((batch, positions, num_top), dtype=torch.float32),
            logits.new_empty((batch, positions if entropy else 0), dtype=torch.float32))


token_logprobs_op = register_op(
    "specops::token_logprobs", SCHEMA, check=check, check_values=check_values, outputs=outputs,
    backends=Backends(reference=token_logprobs_reference, cpu=token_logprobs_cpu,
                      triton=imported_on_first_use(f"{__package__}.launch",
                                                   "token_logprobs_triton")),
)
