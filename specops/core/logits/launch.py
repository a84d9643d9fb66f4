"""Launching ``triton.row_statistics_kernel``: one program per row of logits, one ``kernel[grid]``
launch (core/launch/launcher.py)."""

from __future__ import annotations

import torch

from ..launch.launcher import TritonKernel, build_options, placeholder
from ..sampling import step_triton
from ..sampling.race import CHUNK_SIZE
from .rule import Step
from .triton import row_statistics_kernel

# The kernels' STEP flags, and the factor of the most drafts before a row.
BIAS, MASK, PENALTIES, PROMPT, DRAFTS = (flag.value for flag in (
    step_triton.BIAS, step_triton.MASK, step_triton.PENALTIES, step_triton.PROMPT,
    step_triton.DRAFTS))

STATS_FIELDS = 6  # triton.STATS
# How the samplers build the kernels that read logits (no multiply-add contraction, as every
# kernel): a row loop then does about twice the work per value of one reading probabilities
# (triton.processed), so 2 warps, 16 values a thread per chunk, share each chunk's block
# reduction among twice the values (docs/internals/kernel.md, the instruction budget).
FROM_LOGITS_OPTIONS = build_options(2)
# With rule step 0 applied as the rows are read, a value holds more (its bias, count, the drafts'
# hits): at 2 warps Triton 3.6's ptxas runs out of registers and spills; at 4 (8 values a thread)
# it does not, given the cap of 255 (without one it keeps a long chain's variant to 96 and spills).
FROM_LOGITS_STEP_OPTIONS = build_options(4, maxnreg=255)
# The statistics kernel likewise; given no register cap at 2 warps, ptxas keeps it to 64 registers
# and spills around the bisections' bookkeeping, and with a cap of 128 it takes what it needs.
STATISTICS = TritonKernel(row_statistics_kernel, **build_options(2, maxnreg=128))
# With rule step 0 inside, a chunk's values hold more (bias, counts, the drafts' hits): under 128
# it spills, and with the cap at 255 ptxas takes what it needs (about 210).
STATISTICS_STEP = TritonKernel(row_statistics_kernel, **build_options(2, maxnreg=255))


def step_arguments(step: Step | None, draft_token_ids: torch.Tensor, device: torch.device,
                   most_drafts: int | None = None) -> tuple[list, int]:
    """(the kernels' arguments of rule step 0: draft ids and their three strides (request, draft,
    row), bias, bitmask, counts, prompt mask, penalties (1 or B, 4) float64 and their stride; the
    STEP flags), from a target's Step (None: off) and its draft ids: (B, N), row t counting the
    first t; a flattened batch's (T,); or a tree's paths (B, M + 1, max(M, 1)), row t counting
    its own list up to its first id outside [0, V) (``tree/processed.py``'s ``paths``), at most t
    long. The requests have at most ``most_drafts`` drafts before a row (by default the ids' last
    size). Parts that are off get placeholders; the tensors the kernels read as rows are made
    contiguous."""
    step = Step() if step is None else step
    penalties = step.penalties()
    flags = ((step.logit_bias is not None) * BIAS
             + (step.allowed_token_bitmask is not None) * MASK
             + (penalties is not None) * PENALTIES
             + (penalties is not None and penalties.prompt is not None) * PROMPT)
    if penalties is not None:  # the drafts a chunk read counts (step_triton.adjusted_row)
        if most_drafts is None:
            most_drafts = draft_token_ids.shape[-1]
        flags += DRAFTS * (1 << (max(most_drafts, 1) - 1).bit_length())

    def rows(t, dtype):
        return placeholder(device, dtype) if t is None else t.contiguous()

    if penalties is None:
        values, penalty_stride = placeholder(device, torch.float64), 0
    else:
        # And 1 / r of the float32 r the rule divides by, correctly rounded in float64
        # (step_triton.py divides by multiplying with it).
        values = torch.stack(torch.broadcast_tensors(
            penalties.repetition.double(), penalties.frequency.double(),
            penalties.presence.double(), 1.0 / penalties.repetition.float().double()), dim=-1)
        penalty_stride = 4 if values.shape[0] != 1 else 0
    strides = draft_token_ids.stride()  # (request, draft, row)
    ids_strides = ((0, strides[0], 0) if draft_token_ids.dim() == 1 else
                   (*strides, 0) if draft_token_ids.dim() == 2 else
                   (strides[0], strides[2], strides[1]))
    return [draft_token_ids, *ids_strides, rows(step.logit_bias, torch.float32),
            rows(step.allowed_token_bitmask, torch.int32),
            rows(None if penalties is None else penalties.counts, torch.int32),
            rows(None if penalties is None else penalties.prompt, torch.bool),
            values, penalty_stride], flags


def given_or_off(step: tuple[list, int] | None, device: torch.device) -> tuple[list, int]:
    """``step_arguments``' result ``step``, or where None those of step 0 off (placeholders)."""
    if step is None:
        step = step_arguments(None, placeholder(device, torch.int64)[:, None], device)
    return step


def kernel_step(step: tuple[list, int] | None, device: torch.device) -> tuple[list, int]:
    """A verification kernel's rule step 0 arguments (bias, bitmask, counts, prompt mask,
    penalties and their stride; the STEP flags) of ``step_arguments``' (None: off), which the
    kernel reads with its own draft ids."""
    args, flags = given_or_off(step, device)
    return args[4:], flags


def statistics_kernel(step_flags: int) -> TritonKernel:
    """The statistics kernel a launch with rule step 0's ``step_flags`` (0: off) runs."""
    return STATISTICS_STEP if step_flags else STATISTICS


def row_statistics(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor,
                   flattened: tuple[torch.Tensor, int, int] | None = None,
                   min_p_last: bool = False, step: tuple[list, int] | None = None,
                   entropy: torch.Tensor | None = None) -> torch.Tensor:
    """float64 (B * positions, STATS_FIELDS) statistics of every row of logits (B, positions, V)
    (vocabulary stride 1), under each request's parameters (1 or B values each).

    ``flattened`` = (cu, positions, bonus): the logits are a flattened batch's (rows, V), request
    b's n_b + bonus rows from row cu[b] + b * bonus (core/launch/rows_triton.py); the statistics
    are laid out ``positions`` a request, as a padded batch's, and written for its rows only.
    ``min_p_last``: min-p after top-k and top-p (``rule.processed_rows``). ``step``: a target's
    ``step_arguments``, rule step 0 applied as the rows are read (None: the logits as given).
    ``entropy``: (B * positions,) float32, where given written with each row's entropy (nats; 0
    for a greedy row and a row without mass)."""
    if flattened is None:
        batch, positions, vocab = logits.shape
        stride_b, stride_n, _ = logits.stride()
        cu, num_tokens, bonus = placeholder(logits.device, torch.int64), 0, 0
    else:
        cu, positions, bonus = flattened
        batch, vocab = cu.shape[0] - 1, logits.shape[1]
        num_tokens = logits.shape[0] - batch * bonus  # T: the drafts' rows
        stride_b, stride_n = 0, logits.stride(0)
    stats = torch.empty((batch * positions, STATS_FIELDS), dtype=torch.float64,
                        device=logits.device)
    if stats.numel() == 0:
        return stats
    strides = [int(p.numel() != 1) * p.stride(0) for p in (temperature, top_k, top_p, min_p)]
    step_args, flags = given_or_off(step, logits.device)
    kernel = statistics_kernel(flags)
    kernel.fn[(batch * positions,)](logits, stats, temperature, top_k, top_p, min_p, cu,
                                    positions, num_tokens, bonus, vocab, stride_b, stride_n,
                                    *strides, int(min_p_last), *step_args,
                                    stats if entropy is None else entropy, CHUNK=CHUNK_SIZE,
                                    VARLEN=flattened is not None, STEP=flags,
                                    ENTROPY=entropy is not None, **kernel.options)
    return stats
