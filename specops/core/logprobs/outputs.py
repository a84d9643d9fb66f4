"""What the public verifiers from logits add to their outputs when a caller asks for logprobs
(docs/api.md, "Logprobs"): each layout's output tokens mapped to the rows of logits they were
drawn from, then the logprobs op on those rows (``op.py``), after the verification op.

``logprobs="processed"`` reads the rows as verification does (rule step 0 applied: grammar mask,
logit bias, penalties; then each request's parameters); ``"raw"`` the logits as given, at
temperature 1 and nothing truncated: their ``log_softmax``."""

from __future__ import annotations

import torch

from ..logits.rule import Step
from .op import check_num_top, token_logprobs_op

MODES = ("processed", "raw")


def check_request(logprobs, num_top_logprobs, vocab: int) -> None:
    """The public functions' ``logprobs`` and ``num_top_logprobs`` arguments."""
    if logprobs is not None and logprobs not in MODES:
        raise ValueError(f'logprobs must be "processed", "raw" or None; got {logprobs!r}')
    check_num_top("num_top_logprobs", num_top_logprobs, vocab)
    if num_top_logprobs and logprobs is None:
        raise ValueError('num_top_logprobs needs logprobs="processed" or "raw" (the '
                         "distribution the top tokens are ranked by)")


def _raw_parameters(device: torch.device) -> tuple:
    """Temperature 1, nothing truncated: the rows' softmax."""
    return (torch.ones(1, device=device), torch.zeros(1, dtype=torch.int64, device=device),
            torch.ones(1, device=device), torch.zeros(1, device=device))


def run(mode, num_top, logits, token_ids, parameters, order, generated_ids=None,
        cu_num_draft_tokens=None, step: Step = Step()) -> tuple:
    """The op on requests' rows (B, P, V) and their tokens (B, P), row p counting the first p ids
    of its list generated_ids (B, P, K); or a flattened batch's rows (T + B, V) with
    cu_num_draft_tokens and its drafts (T,): (logprobs,), or with num_top (logprobs, top ids, top
    logprobs). Rule step 0 ``step`` for "processed" only."""
    if mode == "raw":
        parameters, order, step = _raw_parameters(logits.device), "vllm", Step()
    result = token_logprobs_op(logits, token_ids, *parameters, num_top, order, False,
                               generated_ids, cu_num_draft_tokens, *step)
    return result[:3] if num_top else result[:1]
