"""The public functions, for application code; each runs a registered op (docs/api.md).

``chain_speculative_sampling`` is FlashInfer's function of that name: it allocates the counters
when none are given, turns ``seed`` / ``offset`` / ``generator`` into the op's int64 tensors, checks
the arguments under the names the caller used, and calls ``torch.ops.specops.chain_speculative_
sampling`` (or its block twin). ``tree_speculative_sampling`` does the same for a tree of drafts
and ``torch.ops.specops.tree_speculative_sampling`` (docs/tree.md, "Tree verification").
Every call goes through the registered op, so eager calls, traced calls and a user's kernel for a
device all see the same op.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from .chain.arguments import ArgumentNames, check_arguments, counters_apart
from .chain.block import op as _block_op
from .chain import from_logits as _chain_from_logits
from .chain.from_logits import LogitsNames, check_logits_arguments
from .chain.token import op as _op
from .core.logits import adjustments as _step
from .core.logits import parameters as _params
from .core.ops.checks import require_tensor, validating_eagerly
from .core.ops.seeding import SeedLike, resolve_seed_and_offset
from .chain.logprobs import chain_logprobs
from .chain.outputs import add_counts
from .chain.lossy import lossy_chain
from .core.logits.acceptance import check_lossy
from .core.logprobs.outputs import check_request as check_logprobs_request
from .tree.logprobs import tree_logprobs
from .tree.lossy import lossy_tree
from .tree import arguments as _tree_arguments, from_logits as _tree_from_logits
from .tree import op as _tree_op

# The names errors give the arguments: the ones this function's caller used.
PUBLIC_NAMES = ArgumentNames(
    accepted_num="maybe_output_accepted_token_num",
    emitted_num="maybe_output_emitted_draft_token_num",
)
LOGITS_NAMES = LogitsNames(chain=PUBLIC_NAMES._replace(target_probs="target_logits"))
VERIFICATIONS = ("token", "block")
Number = Union[int, float, torch.Tensor, None]


def _counters(accepted, emitted, batch, device):
    """The given counters, or new int32 zeros."""
    if accepted is None:
        accepted = torch.zeros(batch, dtype=torch.int32, device=device)
    if emitted is None:
        emitted = torch.zeros(batch, dtype=torch.int32, device=device)
    return accepted, emitted


def opening_checks(verification, target, target_name: str, accepted, emitted,
                   new_counters: bool = True):
    """What every public function starts with: the verification mode and the target tensor
    checked, the counters given or new: (device, accepted, emitted). ``new_counters`` False: the
    counters given (None where not: the ops from logits return their counts)."""
    if verification not in VERIFICATIONS:
        raise ValueError(f'verification must be "token" or "block"; got {verification!r}')
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{target_name} must be a tensor; got {type(target).__name__}")
    device = target.device
    if not new_counters:
        return device, accepted, emitted
    batch = target.shape[0] if target.dim() > 0 else 0
    return (device, *_counters(accepted, emitted, batch, device))


def chain_speculative_sampling(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: SeedLike = None,
    offset: SeedLike = None,
    verification: str = "token",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling over a chain of draft tokens (Leviathan et al. 2023; Chen et al. 2023).

    Args:
        draft_probs: (B, N, V) float32/float16/bfloat16 draft-model probabilities, or None when the
            drafts were chosen greedily (one-hot draft distributions).
        draft_token_ids: (B, N) int32/int64 draft tokens; -1 (or any id outside [0, V)) ends a
            shorter draft.
        target_probs: (B, N + 1, V) target-model probabilities, same dtype as draft_probs.
        maybe_output_accepted_token_num: (B,) int32/int64 counter, added to in place: positions
            accepted by their own coin, each judged independently.
        maybe_output_emitted_draft_token_num: (B,) int32/int64 counter, added to in place: draft
            tokens emitted (the bonus/resampled token not counted).
        deterministic: accepted for compatibility; the output is always reproducible.
        generator: draws (seed, offset) when ``seed`` is None (default: the device's generator).
        seed: int, or int64 tensor of 1 or B elements (per-request seeds: batch invariance).
        offset: int, or int64 tensor of 1 or B elements; default 0 (or drawn, when seed is None).
        verification: "token" (each draft judged on its own: FlashInfer's behaviour) or "block"
            (Sun et al. 2024, docs/block.md: the drafts judged as a block; as exact, and keeps at
            least as many drafts on average).

    Returns:
        (output_token_ids (B, N + 1) int32 with -1 after the emitted tokens, accepted, emitted);
        the counters are the given tensors when given, new int32 tensors otherwise.
    """
    device, accepted, emitted = opening_checks(verification, target_probs, "target_probs",
                                               maybe_output_accepted_token_num,
                                               maybe_output_emitted_draft_token_num)

    verifier = (_op.chain_speculative_sampling_op if verification == "token"
                else _block_op.chain_block_speculative_sampling_op)
    seed_t, offset_t = resolve_seed_and_offset(seed, offset, generator, device)
    check_arguments(draft_probs=draft_probs, draft_token_ids=draft_token_ids,
                    target_probs=target_probs, accepted_num=accepted, emitted_num=emitted,
                    seed=seed_t, offset=offset_t, names=PUBLIC_NAMES)
    seed_t = counters_apart(accepted, emitted, seed_t, PUBLIC_NAMES)
    output = verifier(draft_probs, draft_token_ids, target_probs, accepted, emitted, seed_t,
                      offset_t, deterministic)
    return output, accepted, emitted


def chain_speculative_sampling_from_logits(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
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
    allowed_token_bitmask: Optional[torch.Tensor] = None,
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
    """Speculative sampling of a chain of drafts against the distributions each request's
    sampling parameters make of the target's logits (docs/semantics.md, "Verification from
    logits"): temperature (0: greedy), min-p, top-k, top-p, in vLLM's order, then the rules of
    ``chain_speculative_sampling``.

    Args:
        draft_probs: (B, N, V) float32/float16/bfloat16 draft probabilities the drafts were drawn
            from, or None: drawn from ``draft_logits`` processed with the same parameters, or, when
            that is None too, chosen greedily (one-hot drafts).
        draft_token_ids: (B, N) int32/int64 draft tokens; -1 (or any id outside [0, V)) ends a
            shorter draft.
        target_logits: (B, N + 1, V) float32/float16/bfloat16 target logits; NaN and infinite
            logits count as -inf.
        maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num: (B,) counters
            added to in place, as in ``chain_speculative_sampling``.
        temperature: >= 0 (0: greedy: the largest logit, the lowest index on ties; None: 1);
            top_k: >= 0 (0 or None: off); top_p: in (0, 1] (1 or None: off); min_p: in [0, 1]
            (0 or None: off). Each a number for every request or a tensor of 1 or B values on the
            logits' device (temperature, top_p, min_p float32/float64; top_k int32/int64).
        draft_logits: (B, N, V) the draft's logits, of target_logits' dtype, instead of
            draft_probs.
        draft_temperature, draft_top_k, draft_top_p, draft_min_p: the parameters the drafter
            sampled draft_logits with, as the target's are given; each None: the target's.
        logit_bias: (B, V) float32/float16/bfloat16, added to each request's target logits.
        allowed_token_bitmask: (B, N + 1, ceil(V / 32)) int32, each target row's grammar mask
            (bit i % 32 of word i // 32 set: token i allowed), applied first: a token it does
            not allow has no probability, so a draft outside it is rejected.
        repetition_penalty (> 0; 1 or None: off), frequency_penalty, presence_penalty (0 or
            None: off): OpenAI's and vLLM's penalties, each a number or 1 or B values, applied
            after the mask and the bias with the drafts before each position counted as
            generated; they need output_token_counts.
        output_token_counts: (B, V) int32/int64, how often each token has been generated so far.
        prompt_token_mask: (B, V) bool, the prompt's tokens (the repetition penalty's too).
        processing_order: "vllm" (min-p, top-k, top-p) or "transformers" (top-k, top-p, then
            min-p, as Hugging Face transformers applies them), for the target's rows and the
            draft's logits alike.
        logprobs: "processed" (each output token's log-probability under its position's
            distribution, as verification processed it), "raw" (the ``log_softmax`` of the logits
            as given) or None (docs/api.md, "Logprobs").
        num_top_logprobs: k in [0, V]: with logprobs, the k most likely tokens of each position
            and their logprobs too, as OpenAI's ``top_logprobs``.
        acceptance: "exact" (the default: the tokens follow the target's distribution) or
            "typical": Medusa's typical acceptance, LOSSY (docs/semantics.md, "Lossy
            acceptance"): a draft is kept where its probability exceeds
            min(posterior_threshold, posterior_alpha * exp(-entropy)) (None: 0.09 and 0.3, vLLM's
            defaults), the argmax emitted after the first draft not kept.
        acceptance_rate: a number in [0, 1]: LOSSY, for benchmarking an engine: each draft kept
            with this probability whatever the distributions.
        generator, seed, offset, verification: as in ``chain_speculative_sampling``.

    Returns:
        (output_token_ids (B, N + 1) int32, accepted, emitted), as ``chain_speculative_sampling``;
        with logprobs, then the logprobs (B, N + 1) float32 (-inf where the output is -1); with
        num_top_logprobs = k > 0, then the top ids (B, N + 1, k) int32 and their logprobs
        (B, N + 1, k) float32, most likely first (-1 and -inf past the tokens with probability).
    """
    device, accepted, emitted = opening_checks(verification, target_logits, "target_logits",
                                               maybe_output_accepted_token_num,
                                               maybe_output_emitted_draft_token_num,
                                               new_counters=False)
    verifier = (_op.chain_speculative_sampling_from_logits_op if verification == "token"
                else _block_op.chain_block_speculative_sampling_from_logits_op)
    seed_t, offset_t = resolve_seed_and_offset(seed, offset, generator, device)
    parameters = _params.as_parameters(device, temperature, top_k, top_p, min_p,
                                       draft_temperature, draft_top_k, draft_top_p, draft_min_p)
    adjustments = _step.as_step(device, logit_bias, allowed_token_bitmask, repetition_penalty,
                                frequency_penalty, presence_penalty, output_token_counts,
                                prompt_token_mask)
    _step.check_order(processing_order)  # before an op's schema refuses a non-string unnamed
    lossy = check_lossy(acceptance, posterior_threshold, posterior_alpha, acceptance_rate,
                        verification)
    # The op checks its arguments under the names the caller gave them. This function checks
    # them first where it reads them itself (lossy acceptance, logprobs), takes more (counters),
    # or where the op's schema would refuse a tensor argument that is not one without its name.
    optional = (draft_probs, draft_logits, *adjustments)
    if lossy or logprobs is not None or num_top_logprobs or accepted is not None or \
            emitted is not None or not isinstance(draft_token_ids, torch.Tensor) or \
            not all(t is None or isinstance(t, torch.Tensor) for t in optional):
        check_logits_arguments(draft_probs, draft_token_ids, target_logits, draft_logits,
                               accepted, emitted, seed_t, offset_t, parameters, LOGITS_NAMES,
                               adjustments)
    check_logprobs_request(logprobs, num_top_logprobs,
                           target_logits.shape[-1] if target_logits.dim() else 0)
    if accepted is not None and emitted is not None:
        seed_t = counters_apart(accepted, emitted, seed_t, PUBLIC_NAMES)
    if lossy:
        if validating_eagerly():  # the ops lossy acceptance runs read only part of the input
            _chain_from_logits.check_op_values(
                draft_probs, draft_token_ids, target_logits, draft_logits, seed_t, offset_t,
                *parameters.values(), *adjustments, processing_order)
        accepted, emitted = _counters(accepted, emitted, target_logits.shape[0], device)
        output = lossy_chain(verifier, draft_token_ids, target_logits, accepted, emitted, seed_t,
                             offset_t, list(parameters.values())[:4], adjustments,
                             processing_order, posterior_threshold, posterior_alpha,
                             acceptance_rate)
    else:
        output, *counts = verifier(draft_probs, draft_token_ids, target_logits, draft_logits,
                                   seed_t, offset_t, *parameters.values(), *adjustments,
                                   processing_order)
        accepted, emitted = add_counts(accepted, emitted, *counts)
    return (output, accepted, emitted) + chain_logprobs(
        logprobs, num_top_logprobs, target_logits, draft_token_ids, output,
        list(parameters.values())[:4], adjustments, processing_order)


def tree_speculative_sampling(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    with_replacement: bool = True,
    verification: str = "token",
    generator: Optional[torch.Generator] = None,
    seed: SeedLike = None,
    offset: SeedLike = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling over a tree of drafts, exact (docs/tree.md, "Tree verification"):
    SpecInfer's multi-round rejection sampling (Miao et al. 2024), its without-replacement form,
    recursive rejection sampling (Jeon et al. 2024), or target-only verification when there are
    no draft probabilities.

    Node 0 is the root (the last accepted token); nodes 1..M are the drafts.

    Args:
        draft_probs: (B, M + 1, V) float32/float16/bfloat16: row i is the draft distribution node
            i's children were drawn from (leaves' rows are not read); or None: target-only
            verification, exact however the children were chosen (top-k, say).
        draft_token_ids: (B, M) int32/int64: the token of node i + 1; -1 (or any id outside
            [0, V)) marks an absent node.
        parents: (B, M) int32/int64: the parent of node i + 1, in [0, i]; any value for an
            absent node.
        target_probs: (B, M + 1, V): row i is the target's distribution after the path from the
            root to node i.
        with_replacement: the children of a node were drawn independently from its draft row
            (True) or without replacement (False); ignored without draft_probs.
        verification: "token" (node by node from the root) or "traversal" (Weng et al. 2025:
            from the leaves, each path judged as a whole; exact for the same trees, and keeps
            more with draft probabilities; target-only it is the token rule, which no exact rule
            beats there).
        generator: draws (seed, offset) when ``seed`` is None (default: the device's generator).
        seed: int, or int64 tensor of 1 or B elements (per-request seeds: batch invariance).
        offset: int, or int64 tensor of 1 or B elements; default 0 (or drawn, when seed is None).

    Returns:
        (output_token_ids (B, M + 1): the accepted path's tokens, one drawn token, then -1;
        output_node_ids (B, M): the accepted nodes (1..M) in path order, then -1;
        emitted (B,): drafts accepted), all int32.
    """
    require_tensor("target_probs", target_probs)
    device = target_probs.device
    seed_t, offset_t = resolve_seed_and_offset(seed, offset, generator, device)
    _tree_arguments.check_arguments(draft_probs, draft_token_ids, parents, target_probs, seed_t,
                                    offset_t, with_replacement)
    _tree_arguments.check_verification(verification)
    return _tree_op.tree_speculative_sampling_op(draft_probs, draft_token_ids, parents,
                                                 target_probs, seed_t, offset_t, with_replacement,
                                                 verification)


def tree_speculative_sampling_from_logits(
    draft_probs: Optional[torch.Tensor],
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
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
    allowed_token_bitmask: Optional[torch.Tensor] = None,
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
    with_replacement: bool = True,
    verification: str = "token",
    generator: Optional[torch.Generator] = None,
    seed: SeedLike = None,
    offset: SeedLike = None,
) -> tuple[torch.Tensor, ...]:
    """Speculative sampling over a tree of drafts against the distributions each request's
    sampling parameters make of the target's logits: the rule of
    ``chain_speculative_sampling_from_logits`` (docs/semantics.md, "Verification from logits")
    on every row, then the rules of ``tree_speculative_sampling`` (docs/tree.md). At temperature
    0 every row is one-hot at its largest logit: the walk keeps the path of the target's argmaxes
    as far as the tree holds it.

    Args:
        draft_probs: (B, M + 1, V) float32/float16/bfloat16 draft probabilities, as in
            ``tree_speculative_sampling``; or None: from ``draft_logits`` processed with the
            draft's parameters, or, when that is None too, target-only verification.
        draft_token_ids, parents: (B, M) as in ``tree_speculative_sampling``.
        target_logits: (B, M + 1, V) float32/float16/bfloat16: row i is the target's logits after
            the path to node i; NaN and infinite logits count as -inf.
        temperature, top_k, top_p, min_p: as in ``chain_speculative_sampling_from_logits``.
        draft_logits: (B, M + 1, V) the draft's logits, of target_logits' dtype, instead of
            draft_probs.
        draft_temperature, draft_top_k, draft_top_p, draft_min_p: as in
            ``chain_speculative_sampling_from_logits`` (each None: the target's).
        logit_bias: (B, V), as in ``chain_speculative_sampling_from_logits``.
        allowed_token_bitmask: (B, M + 1, ceil(V / 32)) int32: row i's grammar mask (the
            grammar's state after the path to node i).
        repetition_penalty, frequency_penalty, presence_penalty, output_token_counts,
            prompt_token_mask: as in ``chain_speculative_sampling_from_logits``, row i counting
            the tokens on the path to node i as generated.
        processing_order, logprobs, num_top_logprobs: as in
            ``chain_speculative_sampling_from_logits``; output position j's token is drawn from
            the row of the path's j-th node (the root's for j = 0).
        acceptance, posterior_threshold, posterior_alpha, acceptance_rate: LOSSY acceptance, as
            in ``chain_speculative_sampling_from_logits`` (docs/semantics.md, "Lossy
            acceptance"): the path to the deepest node whose path passes the rule's test.
        with_replacement, verification, generator, seed, offset: as in
            ``tree_speculative_sampling`` (verification="traversal" with the exact acceptance
            only).

    Returns:
        (output_token_ids (B, M + 1), output_node_ids (B, M), emitted (B,)), all int32, as
        ``tree_speculative_sampling``; then the logprobs (B, M + 1) and top tokens as in
        ``chain_speculative_sampling_from_logits``, where asked for.
    """
    require_tensor("target_logits", target_logits)
    device = target_logits.device
    seed_t, offset_t = resolve_seed_and_offset(seed, offset, generator, device)
    parameters = _params.as_parameters(device, temperature, top_k, top_p, min_p,
                                       draft_temperature, draft_top_k, draft_top_p, draft_min_p)
    target, draft = list(parameters.values())[:4], list(parameters.values())[4:]
    step = _step.as_step(device, logit_bias, allowed_token_bitmask, repetition_penalty,
                         frequency_penalty, presence_penalty, output_token_counts,
                         prompt_token_mask)
    _step.check_order(processing_order)  # before an op's schema refuses a non-string unnamed
    _tree_from_logits.check(draft_probs, draft_token_ids, parents, target_logits, draft_logits,
                            seed_t, offset_t, *target, with_replacement, *draft, *step,
                            processing_order, verification)
    check_logprobs_request(logprobs, num_top_logprobs, target_logits.shape[-1])
    if check_lossy(acceptance, posterior_threshold, posterior_alpha, acceptance_rate):
        if verification != "token":
            raise ValueError(f'verification={verification!r} takes the exact acceptance only: '
                             f'lossy acceptance ({acceptance!r}, or acceptance_rate) judges each '
                             f'path by its own rule; pass verification="token"')
        if validating_eagerly():  # the ops lossy acceptance runs read only part of the input
            _tree_from_logits.check_values(
                draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed_t,
                offset_t, *target, with_replacement, *draft, *step, processing_order,
                verification)
        output, nodes, emitted = lossy_tree(
            _tree_op.tree_speculative_sampling_from_logits_op, draft_token_ids, parents,
            target_logits, seed_t, offset_t, target, processing_order, posterior_threshold,
            posterior_alpha, acceptance_rate, step)
    else:
        output, nodes, emitted = _tree_op.tree_speculative_sampling_from_logits_op(
            draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed_t, offset_t,
            *target, with_replacement, *draft, *step, processing_order, verification)
    return (output, nodes, emitted) + tree_logprobs(
        logprobs, num_top_logprobs, target_logits, draft_token_ids, parents, output, nodes,
        target, step, processing_order)
