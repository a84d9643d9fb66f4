"""Launching the block-verification kernels: programs per candidate row from the launch model
(``core/launch/occupancy.py``), the output and the row pass's partials, then two ``kernel[grid]``
launches (``core/launch/launcher.py``)."""

from __future__ import annotations

import torch

from ...core.launch import occupancy
from ...core.launch.launcher import FOUR_WARPS, TritonKernel, build_options, placeholder
from ...core.logits.launch import FROM_LOGITS_OPTIONS, FROM_LOGITS_STEP_OPTIONS, kernel_step
from ...core.sampling.race import CHUNK_SIZE, num_chunks
from ..from_logits_triton import on_row_statistics
from ..rows import Flattened, padded_rows
from . import slots
from .kernel import PARTIAL_FIELDS, block_row_pass_kernel, block_scan_kernel

MAX_SPLITS = 256  # most programs one row is split over (a power of two: the scan's lanes)
# Chunks whose masses a program holds at once (of 128 threads, one float32 and race each for half
# of them: at 128, ptxas gave one variant 88 registers instead of about 64).
GROUP = 64
# tests/sass.py compiles each kernel with its options, read from these.
ROW_PASS = TritonKernel(block_row_pass_kernel, **FOUR_WARPS)
ROW_PASS_FROM_LOGITS = TritonKernel(block_row_pass_kernel, **FROM_LOGITS_OPTIONS)
ROW_PASS_STEP = TritonKernel(block_row_pass_kernel, **FROM_LOGITS_STEP_OPTIONS)
# The scan, one program a request: given no register cap, ptxas keeps its variant applying rule
# step 0 to 64 registers and spills 8 bytes; with a cap of 128 it takes what it needs.
SCAN = TritonKernel(block_scan_kernel, **build_options(4, maxnreg=128))


def block_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    num_splits: int | None = None,
    target_stats: torch.Tensor | None = None,
    draft_stats: torch.Tensor | None = None,
    flattened: Flattened | None = None,
    target_step: tuple[list, int] | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.block_speculative_sampling_reference``.

    ``num_splits`` overrides the programs per row (tests use it to show the output does not depend
    on it). With ``target_stats`` (and ``draft_stats``), target_probs (and draft_probs) hold
    logits, read through those rows' statistics (core/logits/launch.py). With ``flattened``,
    the batch is flattened (``specops.varlen``): its rows are read where they are, never copied.
    ``target_step``: the target logits' rule step 0 (``core/logits/launch.step_arguments``),
    applied as they are read. No host synchronisation; two launches; every tensor it allocates is
    private to the call (safe on concurrent streams and in CUDA graphs).
    """
    layout = padded_rows if flattened is None else flattened.rows
    (batch, num_draft, num_tokens, cu, target_probs, (stride_tb, stride_tn), draft_probs,
     (stride_db, stride_dn), (stride_ib, stride_in)) = layout(draft_probs, draft_token_ids,
                                                              target_probs)
    vocab = target_probs.shape[-1]
    if draft_probs is None:
        draft_stats = None
    has_draft = draft_probs is not None
    out = torch.empty((batch, num_draft + 1), dtype=torch.int32, device=target_probs.device)
    if batch == 0:
        return out
    rows = batch * (num_draft + 1)  # the partials' and masses' rows, N + 1 a request
    chunks = num_chunks(vocab)
    draft = draft_probs if has_draft else target_probs  # placeholder pointer when None
    seed_stride = 0 if seed.numel() == 1 else seed.stride(0)
    offset_stride = 0 if offset.numel() == 1 else offset.stride(0)
    per_request = int(seed.numel() != 1)
    logits, draft_logits = target_stats is not None, draft_stats is not None
    no_stats = placeholder(out.device, torch.float64)
    target_stats = no_stats if target_stats is None else target_stats
    draft_stats = no_stats if draft_stats is None else draft_stats
    step_args, step_flags = kernel_step(target_step, out.device)
    row_constexprs = dict(HAS_DRAFT=has_draft, GROUP=GROUP, CHUNK=CHUNK_SIZE, LOGITS=logits,
                          DRAFT_LOGITS=draft_logits, VARLEN=flattened is not None,
                          STEP=step_flags)
    row_args = [target_probs, draft, draft_token_ids, seed, offset,
                placeholder(out.device, torch.float64), placeholder(out.device, torch.float32),
                target_stats, draft_stats, cu, *step_args, num_draft, num_tokens, vocab, 0,
                stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in, seed_stride,
                offset_stride, per_request, slots.CDF_SLOT, slots.race_slot(0)]
    row_pass = ROW_PASS_STEP if step_flags else ROW_PASS_FROM_LOGITS if logits else ROW_PASS
    # The plan's look-up runs before the partials and masses exist: the placeholders have their
    # dtypes.
    resources = row_pass.resources(*row_args, **row_constexprs)
    splits, per_program = occupancy.row_split(resources, rows, chunks,
                                              CHUNK_SIZE * target_probs.element_size(),
                                              MAX_SPLITS, None if num_splits is None
                                              else int(num_splits))
    # The programs' race results and every chunk's mass of every candidate row (kernel.py has the
    # layouts), for the scan.
    partials = torch.empty((rows, splits, PARTIAL_FIELDS), dtype=torch.float64, device=out.device)
    masses = torch.empty((rows, chunks), dtype=torch.float32, device=out.device)
    row_args[5], row_args[6] = partials, masses
    row_args[13 + len(step_args)] = per_program
    row_pass.fn[(batch, num_draft + 1, splits)](*row_args, **row_constexprs, **row_pass.options)
    # BLOCK_S is fixed: the batch size selects no kernel.
    SCAN.fn[(batch,)](
        target_probs, draft, draft_token_ids, accepted_num, emitted_num, seed, offset, out,
        partials, masses, target_stats, draft_stats, cu, *step_args, num_draft, num_tokens, vocab,
        splits,
        stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in, accepted_num.stride(0),
        emitted_num.stride(0), seed_stride, offset_stride, per_request,
        slots.stop_slot(vocab, 0), HAS_DRAFT=has_draft, BLOCK_N=1 << num_draft.bit_length(),
        BLOCK_S=MAX_SPLITS, CHUNK=CHUNK_SIZE, LOGITS=logits, DRAFT_LOGITS=draft_logits,
        VARLEN=flattened is not None, STEP=step_flags, **SCAN.options)
    return out


# Verification from logits: every row's statistics, then the kernels above reading the logits.
block_speculative_sampling_from_logits_triton = on_row_statistics(block_speculative_sampling_triton)
