"""The public functions of verification on a flattened batch (docs/api.md, "Flattened
batches"): each checks its arguments under the caller's names and runs a registered op."""

from __future__ import annotations

from typing import Optional

import torch

from ..api import PUBLIC_NAMES, VERIFICATIONS, Number, _counters
from ..chain.arguments import counters_apart
from ..chain.lossy import lossy_chain
from ..chain.outputs import add_counts
from ..core.logits.acceptance import check_lossy
from ..chain.token.op import chain_speculative_sampling_from_logits_op
from ..core.logits import adjustments as step
from ..core.logits import parameters as params
from ..core.ops.checks import require_tensor, validating_eagerly
from ..core.ops.seeding import SeedLike, resolve_seed_and_offset
from ..core.logprobs.outputs import check_request
from .arguments import Names, check_layout, check_logits_layout, check_logits_op_values
from .logprobs import varlen_logprobs
from .op import (varlen_chain_block_speculative_sampling_from_logits_op,
                 varlen_chain_block_speculative_sampling_op,
                 varlen_chain_speculative_sampling_from_logits_op,
                 varlen_chain_speculative_sampling_op)

NAMES = Names(PUBLIC_NAMES)
LOGITS_NAMES = Names(PUBLIC_NAMES._replace(target_probs="target_logits"))


def _opening(verification, target, target_name, cu, accepted, emitted, new_counters=True):
    """The verification mode checked, the counters given or new (B from ``cu``'s length);
    ``new_counters`` False: the counters given (None where not: the ops from logits return their
    counts)."""
    if verification not in VERIFICATIONS:
        raise ValueError(f'verification must be "token" or "block"; got {verification!r}')
    require_tensor(target_name, target)
    require_tensor(NAMES.cu_num_draft_tokens, cu)
    if not new_counters:
        return target.device, accepted, emitted
    batch = max(cu.shape[0] - 1, 0) if cu.dim() == 1 else 0
    return (target.device, *_counters(accepted, emitted, batch, target.device))


def chain_speculative_sampling(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    max_num_draft_tokens: int,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    *,
    generator: Optional[torch.Generator] = None,
    seed: SeedLike = None,
    offset: SeedLike = None,
    verification: str = "token",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``specops.chain_speculative_sampling`` on a flattened batch: request b gets exactly the
    tokens and counts the padded function gives it (its drafts padded with -1 to any width, the
    same seeds and offsets).

    Args:
        draft_probs: (T, V) draft probabilities of every request's drafts, stacked, or None
            (one-hot drafts).
        draft_token_ids: (T,) int32/int64: request b's drafts are [cu[b], cu[b + 1]).
        target_probs: (T + B, V): request b's N_b + 1 rows (its drafts' positions, then the bonus
            position) from row cu[b] + b, stacked in request order.
        cu_num_draft_tokens: (B + 1,) int32/int64 on the same device: 0 = cu[0] <= ... <= cu[B]
            = T.
        max_num_draft_tokens: an int >= every N_b: the output is (B, max + 1).
        maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num, generator, seed,
            offset, verification: as in ``specops.chain_speculative_sampling``.

    Returns:
        (output_token_ids (B, max_num_draft_tokens + 1) int32 with -1 after the emitted tokens,
        accepted, emitted).
    """
    device, accepted, emitted = _opening(verification, target_probs, "target_probs",
                                         cu_num_draft_tokens, maybe_output_accepted_token_num,
                                         maybe_output_emitted_draft_token_num)
    seed_t, offset_t = resolve_seed_and_offset(seed, offset, generator, device)
    check_layout(draft_probs, draft_token_ids, target_probs, cu_num_draft_tokens,
                 max_num_draft_tokens, accepted, emitted, seed_t, offset_t, NAMES)
    seed_t = counters_apart(accepted, emitted, seed_t, NAMES.chain)
    verifier = (varlen_chain_speculative_sampling_op if verification == "token"
                else varlen_chain_block_speculative_sampling_op)
    output = verifier(draft_probs, draft_token_ids, target_probs, cu_num_draft_tokens,
                      max_num_draft_tokens, accepted, emitted, seed_t, offset_t)
    return output, accepted, emitted


def chain_speculative_sampling_from_logits(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    max_num_draft_tokens: int,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    *,
    temperature: Number = 1.0,
    top_k: Number = None,
    top_p: Number = None,
    min_p: Number = None,
    draft_logits: Optional[torch.Tensor] = None,
    draft_temperature: Number = None,
    draft_top_k: Number = None,
    draft_top_p: Number = None,
    draft_min_p: Number = None,
    logit_bias: Optional[torch.Tensor] = None,
    allowed_token_bitmask: Optional[torch.Tensor] = None,  # (T + B, ceil(V / 32))
    repetition_penalty: Number = None,
    frequency_penalty: Number = None,
    presence_penalty: Number = None,
    output_token_counts: Optional[torch.Tensor] = None,
    prompt_token_mask: Optional[torch.Tensor] = None,
    processing_order: str = "vllm",
    logprobs: Optional[str] = None,
    num_top_logprobs: int = 0,
    acceptance: str = "exact",
    posterior_threshold: Optional[float] = None,
    posterior_alpha: Optional[float] = None,
    acceptance_rate: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
    seed: SeedLike = None,
    offset: SeedLike = None,
    verification: str = "token",
) -> tuple[torch.Tensor, ...]:
    """``specops.chain_speculative_sampling_from_logits`` on a flattened batch: the layout of
    ``chain_speculative_sampling`` above (``target_logits`` (T + B, V), ``draft_logits`` (T, V)),
    each request's sampling parameters (1 or B values) applied to its rows; request b gets exactly
    the tokens, counts and logprobs (B, max + 1, where asked for) the padded function gives it,
    lossy acceptance included."""
    device, accepted, emitted = _opening(verification, target_logits, "target_logits",
                                         cu_num_draft_tokens, maybe_output_accepted_token_num,
                                         maybe_output_emitted_draft_token_num,
                                         new_counters=False)
    seed_t, offset_t = resolve_seed_and_offset(seed, offset, generator, device)
    parameters = params.as_parameters(device, temperature, top_k, top_p, min_p,
                                      draft_temperature, draft_top_k, draft_top_p, draft_min_p)
    adjustments = step.as_step(device, logit_bias, allowed_token_bitmask, repetition_penalty,
                               frequency_penalty, presence_penalty, output_token_counts,
                               prompt_token_mask)
    check_logits_layout(draft_probs, draft_token_ids, target_logits, cu_num_draft_tokens,
                        max_num_draft_tokens, draft_logits, accepted, emitted, seed_t, offset_t,
                        parameters, LOGITS_NAMES, adjustments)
    check_request(logprobs, num_top_logprobs, target_logits.shape[-1])
    step.check_order(processing_order)  # before an op's schema refuses a non-string unnamed
    lossy = check_lossy(acceptance, posterior_threshold, posterior_alpha, acceptance_rate,
                        verification)
    if accepted is not None and emitted is not None:
        seed_t = counters_apart(accepted, emitted, seed_t, NAMES.chain)
    if lossy:  # as the padded batch the layout stands for, read where the rows are
        if validating_eagerly():  # the ops lossy acceptance runs read only part of the input
            check_logits_op_values(draft_probs, draft_token_ids, target_logits,
                                   cu_num_draft_tokens, max_num_draft_tokens, draft_logits,
                                   seed_t, offset_t, *parameters.values(), *adjustments,
                                   processing_order)
        accepted, emitted = _counters(accepted, emitted, cu_num_draft_tokens.shape[0] - 1,
                                      device)
        output = lossy_chain(
            chain_speculative_sampling_from_logits_op, draft_token_ids, target_logits, accepted,
            emitted, seed_t, offset_t, list(parameters.values())[:4], adjustments,
            processing_order, posterior_threshold, posterior_alpha, acceptance_rate,
            cu_num_draft_tokens, max_num_draft_tokens)
    else:
        verifier = (varlen_chain_speculative_sampling_from_logits_op if verification == "token"
                    else varlen_chain_block_speculative_sampling_from_logits_op)
        output, *counts = verifier(draft_probs, draft_token_ids, target_logits,
                                   cu_num_draft_tokens, max_num_draft_tokens, draft_logits,
                                   seed_t, offset_t, *parameters.values(), *adjustments,
                                   processing_order)
        accepted, emitted = add_counts(accepted, emitted, *counts)
    return (output, accepted, emitted) + varlen_logprobs(
        logprobs, num_top_logprobs, target_logits, draft_token_ids, cu_num_draft_tokens, output,
        list(parameters.values())[:4], adjustments, processing_order)
