"""Launching the block-verification kernels: programs per candidate row from the launch model
(``specops/core/occupancy.py``), the output with its scratch in one allocation, two launches."""

from __future__ import annotations

import functools

import torch
import triton

from ..core.occupancy import RowPass
from ..core.race import CHUNK_SIZE, num_chunks
from . import slots
from .kernel import block_row_pass_kernel, block_scan_kernel

MAX_SPLITS = 256  # most programs one row is split over (a power of two: the scan's lanes)
NUM_WARPS = 4  # 128 threads x 8 values of a 1024-value chunk: 16-byte loads even for bf16/fp16
# Chunks whose masses a program holds at once (one float32 per thread and race at 4 warps).
GROUP = 128
# How the kernels are built (tests/test_block_compile.py compiles with the same options). No
# multiply-add contraction, so every float operation rounds as the torch reference's does.
LAUNCH_OPTIONS = {"num_warps": NUM_WARPS, "num_stages": 1, "enable_fp_fusion": False}
# Registers per thread of the compiled row pass (Triton 3.9.0, sm_90, num_warps=4), by probability
# dtype, draft_probs given, and V % 16 == 0 (16-byte row loads; else scalar loads).
# tests/test_block_compile.py checks them against every variant it compiles.
REGISTERS = {
    (torch.float32, True, True): 64,
    (torch.float32, False, True): 64,
    (torch.float16, True, True): 56,
    (torch.float16, False, True): 64,
    (torch.bfloat16, True, True): 56,
    (torch.bfloat16, False, True): 64,
    (torch.float32, True, False): 104,
    (torch.float32, False, False): 84,
    (torch.float16, True, False): 104,
    (torch.float16, False, False): 80,
    (torch.bfloat16, True, False): 104,
    (torch.bfloat16, False, False): 80,
}
ROW_PASS = RowPass(REGISTERS, NUM_WARPS, MAX_SPLITS)
programs_held = ROW_PASS.programs_held
# The plan for the row pass over rows = B (N + 1) candidate rows: (rows, vocab, dtype, has_draft).
launch_plan = functools.lru_cache(maxsize=4096)(ROW_PASS.plan)


def choose_num_splits(rows: int, vocab: int, dtype: torch.dtype, has_draft: bool,
                      requested: int | None = None) -> int:
    """Programs per candidate row: the launch model's (or ``requested``, rounded so that every
    program has an equal number of chunks and none has none)."""
    if requested is None:
        return launch_plan(rows, vocab, dtype, has_draft).programs_per_request
    chunks = num_chunks(vocab)
    per_program = triton.cdiv(chunks, max(1, min(chunks, MAX_SPLITS, int(requested))))
    return triton.cdiv(chunks, per_program)


def scratch_int32s(rows: int, splits: int) -> int:
    """int32 words the output allocation holds past the (B, N+1) output (kernel._scratch), for
    rows = B (N + 1): 8-byte alignment padding, float64 (rows, S, 2) keys, float64 (rows, S)
    masses, float64 (rows,) weights, int32 (rows, S) tokens."""
    return rows % 2 + rows * splits * 4 + rows * splits * 2 + rows * 2 + rows * splits


def block_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.block_speculative_sampling_reference``.

    ``num_splits`` overrides the programs per row (tests use it to show the output does not depend
    on it). No host synchronisation; two launches; one allocation, private to the call (safe on
    concurrent streams and in CUDA graphs): the output, with the scratch after it.
    """
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    has_draft = draft_probs is not None
    if target_probs.stride(2) != 1:  # the row pass needs unit vocabulary stride (16-byte loads)
        target_probs = target_probs.contiguous()
    if has_draft and draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()
    rows = batch * (num_draft + 1)
    splits = choose_num_splits(rows, vocab, target_probs.dtype, has_draft, num_splits)
    # One allocation, output then scratch, shrunk in place to the output's shape (no second tensor).
    out = torch.empty(rows + scratch_int32s(rows, splits), dtype=torch.int32,
                      device=target_probs.device).resize_(batch, num_draft + 1)
    if batch == 0:
        return out

    draft = draft_probs if has_draft else target_probs  # placeholder pointer when None
    stride_tb, stride_tn, _ = target_probs.stride()
    stride_db, stride_dn = draft_probs.stride()[:2] if has_draft else (0, 0)
    stride_ib, stride_in = draft_token_ids.stride()
    seed_stride = 0 if seed.numel() == 1 else seed.stride(0)
    offset_stride = 0 if offset.numel() == 1 else offset.stride(0)
    per_request = int(seed.numel() != 1)
    block_row_pass_kernel[(batch, num_draft + 1, splits)](
        target_probs, draft, draft_token_ids, seed, offset, out,
        num_draft, vocab, triton.cdiv(num_chunks(vocab), splits),
        stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
        seed_stride, offset_stride, per_request,
        slots.cdf_slot(num_draft), slots.race_slot(num_draft, 0),
        HAS_DRAFT=has_draft, GROUP=GROUP, CHUNK=CHUNK_SIZE, **LAUNCH_OPTIONS,
    )
    block_scan_kernel[(batch,)](
        target_probs, draft, draft_token_ids, accepted_num, emitted_num, seed, offset, out,
        num_draft, vocab, splits,
        stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
        accepted_num.stride(0), emitted_num.stride(0), seed_stride, offset_stride, per_request,
        slots.stop_slot(num_draft, 0),
        HAS_DRAFT=has_draft, BLOCK_N=triton.next_power_of_2(num_draft + 1),
        BLOCK_S=MAX_SPLITS, **LAUNCH_OPTIONS,  # BLOCK_S fixed: the batch size selects no kernel
    )
    return out
