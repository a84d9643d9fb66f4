"""The vocabulary-parallel public functions: ``specops.chain_speculative_sampling`` and its
from-logits twin for a rank's vocabulary shard (docs/api.md, "Vocabulary-parallel
verification").

A call runs its local checks, then the layout exchange (comm.py) whatever they found, so that a
refusal on any rank, or ranks given other seeds, offsets or draft ids, becomes the same
ValueError on every rank and no rank waits in a collective another never makes; then the seed
(drawn on the first rank when not given), then the shards' verification (verify.py), made of
pure-torch steps, not of the kernels.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.distributed as dist

from ..api import LOGITS_NAMES, PUBLIC_NAMES, VERIFICATIONS, Number, opening_checks
from ..chain.arguments import (PROB_DTYPES, check_arguments, check_counters_apart, check_values,
                               padded_rows_read)
from ..chain.from_logits import check_logits_arguments, check_logits_values
from ..core.ops.checks import check_masses, dtype_error, require_tensor, shape, validation_enabled
from ..core.logits import adjustments as step_arguments
from ..core.logits import parameters as params
from ..core.logits.acceptance import check_lossy
from ..core.logits.rule import ORDERS, Step, per_row
from ..core.logprobs.op import check_num_top
from ..core.logprobs.outputs import MODES, check_request
from ..core.ops.seeding import SeedLike, resolve_seed_and_offset
from .comm import (Layout, Record, all_reduce, broadcast_from_first, exchange_layout,
                   refused_index, resolve_group)
from .logits import (SEARCH_TOP_K, SEARCH_TOP_P, adjusted_shard, processed_inputs,
                     shard_logprobs)
from .lossy import lossy_shard_chain
from .shards import Shard
from .verify import VERIFIERS

# The caller's names of the arguments a layout error names where they differ from comm's.
_LOGITS_NAMES = {"target_probs": "target_logits"}


# SPECOPS_VALIDATE=1 before the layout exchange: ids are checked against the global vocabulary
# after it (the same check on every rank), so none is refused here for lying past a shard.
_ANY_ID = 2**62


def _shard_arguments(vocab_start, vocab_size) -> tuple[int, int]:
    """vocab_start and vocab_size as ints (-1: vocab_size not given)."""
    try:
        start = operator.index(vocab_start)
    except TypeError:
        raise TypeError(f"vocab_start must be an int; got {type(vocab_start).__name__}") from None
    # Bounded so that the layout record (int64) always holds them.
    if not 0 <= start < _ANY_ID:
        raise ValueError(f"vocab_start must be in [0, vocab_size); got {start}")
    if vocab_size is None:
        return start, -1
    try:
        size = operator.index(vocab_size)
    except TypeError:
        raise TypeError(f"vocab_size must be an int or None; got {type(vocab_size).__name__}") \
            from None
    if not 1 <= size < _ANY_ID:
        raise ValueError(f"vocab_size must be in [1, 2**62); got {size}")
    return start, size


def _within(start: int, size: int):
    """The columns of a shard inside [0, vocab_size) as a width (all of them when vocab_size was
    not given): what SPECOPS_VALIDATE=1 reads of a padded shard."""
    return None if size < 0 else max(0, size - start)


def _device(group) -> torch.device:
    """Where the group's collectives run (NCCL: the current CUDA device), whatever the caller
    passed: the layout exchange must happen even when a rank's shard is refused."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_device(device: torch.device, group, name: str) -> None:
    """A shard on a device the group's backend cannot reduce over is refused before any
    collective (NCCL needs CUDA tensors)."""
    if torch.distributed.get_backend(group) == "nccl" and device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device for an NCCL process group; got "
                         f"{device}")


def _opening(verification, target, target_name, accepted, emitted, seed, offset, generator,
             group):
    """The first local checks of every shard call: the public functions' opening (mode, target,
    counters), the device for the group's backend, then the seed and offset as tensors:
    (device, accepted, emitted, seed, offset)."""
    device, accepted, emitted = opening_checks(verification, target, target_name, accepted,
                                               emitted)
    _check_device(device, group, target_name)
    return (device, accepted, emitted, *resolve_seed_and_offset(seed, offset, generator, device))


def _run(prepare, group, names, finish):
    """Local checks (``prepare``: the checked arguments and this rank's Record), the layout
    exchange, the seed, then ``finish(shard, arguments)``."""
    group = resolve_group(group)
    try:
        arguments, record = prepare(group)
        error = None
    except Exception as err:  # any refusal is told to the other ranks before it is raised
        arguments, record, error = None, Record(refused=refused_index(err)), err
    layout = exchange_layout(record, error, names, group, _device(group),
                             None if error is not None else arguments["same"])
    if layout is None:  # under CUDA-graph capture: the eager warm-up call checked the layout
        if record.vocab_size < 0:
            raise ValueError("vocab_size must be given under CUDA-graph capture: the shards' "
                             "widths cannot be exchanged there")
        width = min(record.width, record.vocab_size - record.vocab_start)
        layout = Layout(record.vocab_size, record.vocab_start, width)
    if record.seed_drawn:  # one draw for the group, so that every rank uses the same numbers
        drawn = broadcast_from_first(torch.cat([arguments["seed"], arguments["offset"]]), group)
        arguments["seed"], arguments["offset"] = drawn[:1], drawn[1:]
    if validation_enabled():  # ids against the global vocabulary: the same check on every rank
        check_values(None, arguments["ids"], None, names=arguments["names"], probabilities=False,
                     vocab=layout.vocab_size)
        _check_whole_row_masses(arguments, layout, group)
    shard = Shard(layout.vocab_start, layout.width, layout.vocab_size, group)
    return finish(shard, arguments)


def _check_whole_row_masses(arguments, layout: Layout, group) -> None:
    """SPECOPS_VALIDATE=1: the probability rows the op reads sum to 1 or 0 as whole rows, their
    shards' masses summed over the ranks (``check_row_masses``); the same check on every rank."""
    names = arguments["names"]
    rows_read = padded_rows_read(arguments["ids"], layout.vocab_size)
    for name, rows, read in zip((names.target_probs, names.draft_probs), arguments["probs"],
                                rows_read):
        if rows is not None:  # given on every rank alike (the layout's draft kind agrees)
            mass = _cut(rows, layout.width).double().sum(dim=-1)
            check_masses(name, all_reduce(mass, dist.ReduceOp.SUM, group), read)


def _record(target, draft_kind, verification, seed, arguments, vocab_start, vocab_size,
            searches=0, step_kinds=0, bitmask_words=0, logprobs=None, num_top=0):
    """This rank's Record of a call whose local checks passed (its fingerprints are the layout
    exchange's to fill in)."""
    batch, positions, width = target.shape
    return Record(0, vocab_start, width, batch, positions - 1, vocab_size,
                  PROB_DTYPES.index(target.dtype), draft_kind, VERIFICATIONS.index(verification),
                  int(seed is None), searches, arguments["seed"].numel(),
                  arguments["offset"].numel(), int(validation_enabled()), step_kinds,
                  bitmask_words, 0 if logprobs is None else 1 + MODES.index(logprobs), num_top)


def _same(seed, offset, seed_t, offset_t, ids, parameters=None, step: Step = Step(),
          lossy=(None, None, None)) -> tuple:
    """The values every rank must pass the same (comm.SAME): seed, offset, draft ids and, from
    logits, the sampling parameters (the draft's too), the penalties and the grammar mask; the
    caller's, None where drawn (a draw differs by rank until the first rank's is broadcast) or
    not given. The offset of a given seed is the caller's or 0 on every rank, so it is compared
    too."""
    taken = parameters or {}
    return (None if seed is None else seed_t,
            None if seed is None and offset is None else offset_t, ids,
            *(taken.get(name) for name in (*params.SAMPLING, *params.DRAFT_PARAMETERS)),
            *(getattr(step, name) for name in params.PENALTIES), step.allowed_token_bitmask,
            *lossy)


def _step_kinds(parameters: dict, step: Step, processing_order: str, acceptance: str = "exact",
                acceptance_rate=None) -> int:
    """Which of the sampling step's arguments a call gives, its order and its acceptance rule,
    as bits: what every rank must agree on before the values are compared."""
    given = [getattr(step, name) is not None for name in Step._fields]
    given += [parameters[name] is not None for name in params.DRAFT_PARAMETERS]
    given += [ORDERS[processing_order], acceptance == "typical", acceptance_rate is not None]
    return sum(int(flag) << bit for bit, flag in enumerate(given))


def _as_values(device, *numbers) -> tuple:
    """Python numbers as float64 tensors for the fingerprints (None stays None)."""
    return tuple(None if value is None else torch.tensor([float(value)], dtype=torch.float64,
                                                         device=device) for value in numbers)


def _check_global_bitmask(bitmask, target, covered: int) -> int:
    """A vocabulary-parallel call's grammar mask: the whole vocabulary's, the same on every rank,
    (B, N + 1, W) int32 with its words covering this rank's columns [0, covered); its W."""
    require_tensor("allowed_token_bitmask", bitmask)
    batch, positions, _ = target.shape
    if bitmask.dim() != 3 or tuple(bitmask.shape[:2]) != (batch, positions) or \
            bitmask.shape[2] * 32 < covered:
        raise ValueError(f"allowed_token_bitmask must have shape (batch_size, "
                         f"num_speculate_tokens + 1, ceil(vocab_size / 32)) for the whole "
                         f"vocabulary (the same on every rank), covering this rank's columns up "
                         f"to {covered}; got {shape(bitmask)}")
    if bitmask.dtype not in step_arguments.BITMASK_DTYPES:
        raise dtype_error("allowed_token_bitmask", bitmask, step_arguments.BITMASK_DTYPES)
    if bitmask.device != target.device:
        raise ValueError(f"allowed_token_bitmask must be on the same device as target_logits "
                         f"({target.device}); got {bitmask.device}")
    return bitmask.shape[2]


def _cut(tensor, width):
    """A shard without its columns past the vocabulary (a padded output layer's); all of it when
    width is None."""
    return tensor if tensor is None or width is None else tensor[..., :width]


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
    *,
    vocab_start: int,
    vocab_size: Optional[int] = None,
    group=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``specops.chain_speculative_sampling`` on this rank's vocabulary shard.

    draft_probs (B, N, V_rank) and target_probs (B, N + 1, V_rank) hold global token ids
    [vocab_start, vocab_start + V_rank); the shards of the group's ranks tile [0, vocab_size)
    (the last may run past it: columns past vocab_size are ignored). vocab_size: the global V
    (default: the sum of the shards' widths). group: the process group (default: the world).
    Every other argument is the same on every rank, and so are the outputs and counters.
    """

    def prepare(group):
        device, accepted, emitted, seed_t, offset_t = _opening(
            verification, target_probs, "target_probs", maybe_output_accepted_token_num,
            maybe_output_emitted_draft_token_num, seed, offset, generator, group)
        check_arguments(draft_probs=draft_probs, draft_token_ids=draft_token_ids,
                        target_probs=target_probs, accepted_num=accepted, emitted_num=emitted,
                        seed=seed_t, offset=offset_t, names=PUBLIC_NAMES)
        check_counters_apart(accepted_num=accepted, emitted_num=emitted, names=PUBLIC_NAMES)
        start, size = _shard_arguments(vocab_start, vocab_size)
        if validation_enabled():
            width = _within(start, size)
            check_values(_cut(draft_probs, width), draft_token_ids, _cut(target_probs, width),
                         PUBLIC_NAMES, vocab=_ANY_ID)
        arguments = dict(accepted=accepted, emitted=emitted, seed=seed_t, offset=offset_t,
                         ids=draft_token_ids, names=PUBLIC_NAMES,
                         probs=(target_probs, draft_probs),
                         same=_same(seed, offset, seed_t, offset_t, draft_token_ids))
        return arguments, _record(target_probs, int(draft_probs is not None), verification, seed,
                                  arguments, start, size)

    def finish(shard, a):
        output = VERIFIERS[verification](
            shard, _cut(draft_probs, shard.width), draft_token_ids,
            _cut(target_probs, shard.width), a["accepted"], a["emitted"], a["seed"], a["offset"])
        return output, a["accepted"], a["emitted"]

    return _run(prepare, group, {}, finish)


def _searches(top_k, top_p, draft_top_k=None, draft_top_p=None) -> int:
    """Which threshold searches a call makes, from the arguments' kinds (host values only): a
    tensor may hold any value, a number that turns its step off needs none."""
    searches = 0
    for value in (top_k, draft_top_k):
        if isinstance(value, torch.Tensor) or (value is not None and value != 0):
            searches |= SEARCH_TOP_K
    for value in (top_p, draft_top_p):
        if isinstance(value, torch.Tensor) or (value is not None and value != 1):
            searches |= SEARCH_TOP_P
    return searches


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
    vocab_start: int,
    vocab_size: Optional[int] = None,
    group=None,
) -> tuple[torch.Tensor, ...]:
    """``specops.chain_speculative_sampling_from_logits`` on this rank's vocabulary shard:
    target_logits (B, N + 1, V_rank), and draft_logits or draft_probs (B, N, V_rank), as shards
    like ``chain_speculative_sampling``'s (vocab_start, vocab_size, group the same). The sampling
    parameters (the draft's too), the penalties, ``processing_order`` and
    ``allowed_token_bitmask`` (the whole vocabulary's, (B, N + 1, ceil(V / 32))) are the same on
    every rank; ``logit_bias``, ``output_token_counts`` and ``prompt_token_mask`` are this rank's
    columns (B, V_rank), as the logits are. Top-k and top-p thresholds are found over all ranks.
    ``logprobs`` and ``num_top_logprobs``, and the LOSSY ``acceptance="typical"`` (with
    ``posterior_threshold``, ``posterior_alpha``) or ``acceptance_rate``, as on one device (the
    same on every rank): every rank returns the whole batch's.
    """

    def prepare(group):
        device, accepted, emitted, seed_t, offset_t = _opening(
            verification, target_logits, "target_logits", maybe_output_accepted_token_num,
            maybe_output_emitted_draft_token_num, seed, offset, generator, group)
        parameters = params.as_parameters(device, temperature, top_k, top_p, min_p,
                                          draft_temperature, draft_top_k, draft_top_p,
                                          draft_min_p)
        step = step_arguments.as_step(device, logit_bias, allowed_token_bitmask,
                                      repetition_penalty, frequency_penalty, presence_penalty,
                                      output_token_counts, prompt_token_mask)
        check_logits_arguments(draft_probs, draft_token_ids, target_logits, draft_logits,
                               accepted, emitted, seed_t, offset_t, parameters, LOGITS_NAMES,
                               step._replace(allowed_token_bitmask=None))
        step_arguments.check_order(processing_order)
        check_request(logprobs, num_top_logprobs, _ANY_ID)  # against V after the exchange
        check_lossy(acceptance, posterior_threshold, posterior_alpha, acceptance_rate,
                    verification)
        check_counters_apart(accepted_num=accepted, emitted_num=emitted, names=PUBLIC_NAMES)
        start, size = _shard_arguments(vocab_start, vocab_size)
        words = 0
        if allowed_token_bitmask is not None:
            width = _within(start, size)
            covered = start + (target_logits.shape[-1] if width is None else
                               min(width, target_logits.shape[-1]))
            words = _check_global_bitmask(allowed_token_bitmask, target_logits, covered)
        if validation_enabled():
            width = _within(start, size)
            check_logits_values(_cut(draft_probs, width), draft_token_ids,
                                _cut(target_logits, width), _cut(draft_logits, width), parameters,
                                LOGITS_NAMES, vocab=_ANY_ID, adjustments=_cut_step(step, width))
        arguments = dict(accepted=accepted, emitted=emitted, seed=seed_t, offset=offset_t,
                         parameters=parameters, step=step, ids=draft_token_ids,
                         names=LOGITS_NAMES.chain, probs=(None, draft_probs),
                         same=_same(seed, offset, seed_t, offset_t, draft_token_ids, parameters,
                                    step, _as_values(device, posterior_threshold,
                                                     posterior_alpha, acceptance_rate)))
        draft_kind = 1 if draft_probs is not None else 2 if draft_logits is not None else 0
        return arguments, _record(target_logits, draft_kind, verification, seed, arguments,
                                  start, size, _searches(top_k, top_p, draft_top_k, draft_top_p),
                                  _step_kinds(parameters, step, processing_order, acceptance,
                                              acceptance_rate), words,
                                  logprobs, num_top_logprobs)

    def finish(shard, a):
        # Checks against the exchanged vocabulary, the same on every rank, before any work.
        check_num_top("num_top_logprobs", num_top_logprobs, shard.vocab)
        step = _cut_step(a["step"], shard.width)
        if step.allowed_token_bitmask is not None:  # the same W and V on every rank
            needed = step_arguments.words(shard.vocab)
            if step.allowed_token_bitmask.shape[2] != needed:
                raise ValueError(f"allowed_token_bitmask must have ceil(vocab_size / 32) = "
                                 f"{needed} words per row for vocab_size {shard.vocab}; got "
                                 f"{step.allowed_token_bitmask.shape[2]}")
        parameters = list(a["parameters"].values())
        if acceptance == "typical" or acceptance_rate is not None:
            output = lossy_shard_chain(
                shard, chain_speculative_sampling_from_logits,
                adjusted_shard(shard, _cut(target_logits, shard.width), step, draft_token_ids),
                draft_token_ids, a["accepted"], a["emitted"], a["seed"], a["offset"],
                parameters[:4], _searches(top_k, top_p, draft_top_k, draft_top_p),
                ORDERS[processing_order],
                processing_order, posterior_threshold, posterior_alpha, acceptance_rate)
            return (output, a["accepted"], a["emitted"]) + _shard_logprobs(
                shard, output, step, parameters[:4],
                _searches(top_k, top_p, draft_top_k, draft_top_p))
        draft, target = processed_inputs(
            shard, _cut(draft_probs, shard.width), _cut(target_logits, shard.width),
            _cut(draft_logits, shard.width), *parameters[:4],
            _searches(top_k, top_p, draft_top_k, draft_top_p), parameters[4:], step,
            draft_token_ids, ORDERS[processing_order])
        output = VERIFIERS[verification](shard, draft, draft_token_ids, target, a["accepted"],
                                         a["emitted"], a["seed"], a["offset"])
        return (output, a["accepted"], a["emitted"]) + _shard_logprobs(
            shard, output, step, parameters[:4],
                _searches(top_k, top_p, draft_top_k, draft_top_p))

    def _shard_logprobs(shard, output, step, parameters, searches):
        """The outputs' logprobs (and top tokens), as ``specops.chain_speculative_sampling_
        from_logits`` gives them, over every rank."""
        if logprobs is None:
            return ()
        rows = _cut(target_logits, shard.width)
        if logprobs == "processed":
            rows = adjusted_shard(shard, rows, step, draft_token_ids)
        else:  # the logits' softmax: temperature 1, nothing kept out
            device = rows.device
            parameters = [torch.ones(1, device=device), torch.zeros(1, dtype=torch.int64,
                                                                   device=device),
                          torch.ones(1, device=device), torch.zeros(1, device=device)]
            searches = 0
        batch, positions, _ = rows.shape
        result = shard_logprobs(shard, rows.reshape(batch * positions, shard.width),
                                output.reshape(-1),
                                *(per_row(value, batch, positions) for value in parameters),
                                searches, logprobs == "processed" and ORDERS[processing_order],
                                num_top_logprobs)
        result = tuple(value.reshape(batch, positions, *value.shape[1:]) for value in result)
        return result if num_top_logprobs else result[:1]

    return _run(prepare, group, _LOGITS_NAMES, finish)


def _cut_step(step: Step, width):
    """A Step with this shard's columns of its per-token tensors (bias, counts, prompt mask)
    without the padding; the grammar mask is the whole vocabulary's."""
    return step._replace(**{name: _cut(getattr(step, name), width)
                            for name in ("logit_bias", "output_token_counts", "prompt_token_mask")})
