"""Launching the block-verification kernels: grid, programs per row, scratch, launch options."""

from __future__ import annotations

import torch
import triton

from ..core.race import CHUNK_SIZE, num_chunks
from . import slots
from .kernel import block_row_pass_kernel, block_scan_kernel

# Aim for about this many programs in flight (H100/H200: 132 SMs, ~4 programs each) when the
# B (N + 1) rows alone cannot fill the GPU. A function of B, N and K only: reproducible launches.
TARGET_PROGRAMS = 512
MAX_SPLITS = 256  # most programs one row is split over (a power of two: the scan's lanes)
NUM_WARPS = 4  # 128 threads x 8 values of a 1024-value chunk: 16-byte loads even for bf16/fp16
# How the kernels are built (tests/test_block_compile.py compiles with the same options). No
# multiply-add contraction, so every float operation rounds as the torch reference's does.
LAUNCH_OPTIONS = {"num_warps": NUM_WARPS, "num_stages": 1, "enable_fp_fusion": False}
SCAN_LAUNCH_OPTIONS = {**LAUNCH_OPTIONS, "num_warps": 4}


def choose_num_splits(rows: int, vocab: int, requested: int | None = None) -> int:
    """Programs per candidate row: enough to fill the GPU when there are few rows (or
    ``requested``), each with an equal number of chunks and none without one."""
    chunks = num_chunks(vocab)
    if requested is None:
        requested = TARGET_PROGRAMS // max(rows, 1)
    splits = max(1, min(chunks, MAX_SPLITS, int(requested)))
    per_program = triton.cdiv(chunks, splits)
    return triton.cdiv(chunks, per_program)


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
    on it). No host synchronisation; two launches; a scratch of (B, N + 1, S) masses and winners.
    """
    batch, num_draft = draft_token_ids.shape
    vocab = target_probs.shape[2]
    device = target_probs.device
    out = torch.empty((batch, num_draft + 1), dtype=torch.int32, device=device)
    if batch == 0:
        return out
    if target_probs.stride(2) != 1:  # the row pass needs unit vocabulary stride (16-byte loads)
        target_probs = target_probs.contiguous()
    if draft_probs is not None and draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()

    chunks = num_chunks(vocab)
    splits = choose_num_splits(batch * (num_draft + 1), vocab, num_splits)
    per_program = triton.cdiv(chunks, splits)
    weight = torch.empty((batch, num_draft + 1), dtype=torch.float64, device=device)
    mass = torch.empty((batch, num_draft + 1, splits), dtype=torch.float64, device=device)
    key = torch.empty((batch, num_draft + 1, splits, 2), dtype=torch.float64, device=device)
    token = torch.empty((batch, num_draft + 1, splits, 2), dtype=torch.int32, device=device)

    has_draft = draft_probs is not None
    draft = draft_probs if has_draft else target_probs  # placeholder pointer when None
    stride_db, stride_dn = (draft_probs.stride(0), draft_probs.stride(1)) if has_draft else (0, 0)
    seed_stride = 0 if seed.numel() == 1 else seed.stride(0)
    offset_stride = 0 if offset.numel() == 1 else offset.stride(0)
    per_request = int(seed.numel() != 1)
    block_row_pass_kernel[(batch, num_draft + 1, splits)](
        target_probs, draft, draft_token_ids, seed, offset, weight, mass, key, token,
        num_draft, vocab, chunks, per_program, splits,
        target_probs.stride(0), target_probs.stride(1), stride_db, stride_dn,
        draft_token_ids.stride(0), draft_token_ids.stride(1), seed_stride, offset_stride,
        per_request, slots.cdf_slot(num_draft), slots.race_slot(num_draft, 0),
        HAS_DRAFT=has_draft, CHUNK=CHUNK_SIZE, **LAUNCH_OPTIONS,
    )
    block_scan_kernel[(batch,)](
        target_probs, draft, draft_token_ids, accepted_num, emitted_num, seed, offset, out,
        weight, mass, key, token,
        num_draft, vocab, splits,
        target_probs.stride(0), target_probs.stride(1), stride_db, stride_dn,
        draft_token_ids.stride(0), draft_token_ids.stride(1), accepted_num.stride(0),
        emitted_num.stride(0), out.stride(0), seed_stride, offset_stride, per_request,
        slots.stop_slot(num_draft, 0),
        HAS_DRAFT=has_draft, BLOCK_N=triton.next_power_of_2(num_draft + 1),
        BLOCK_S=MAX_SPLITS, **SCAN_LAUNCH_OPTIONS,  # fixed: the batch size selects no kernel
    )
    return out
