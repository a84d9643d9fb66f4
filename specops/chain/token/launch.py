"""Launching the token-verification kernel: programs per request from the launch model
(``core/launch/occupancy.py``), the output and, with P > 1, the call's own row-pass partials and
arrival counts, then one ``kernel[grid]`` launch (``core/launch/launcher.py``)."""

from __future__ import annotations

import functools

import torch

from ...core.launch import occupancy
from ...core.launch.launcher import FOUR_WARPS, TritonKernel, build_options, placeholder
from ...core.logits.launch import FROM_LOGITS_OPTIONS, FROM_LOGITS_STEP_OPTIONS, kernel_step
from ...core.sampling.race import CHUNK_SIZE, num_chunks
from ..from_logits_triton import on_row_statistics
from ..rows import Flattened, padded_rows
from . import slots
from .kernel import PARTIAL_FIELDS, chain_speculative_sampling_kernel

# Most programs per request: a request's last program reads their partials in one block.
MAX_PROGRAMS_PER_REQUEST = 256
# Chunks whose masses a program holds at once (one float32 per thread and race at 4 warps).
GROUP = 128
# tests/sass.py compiles each kernel with its options, read from these.
MAIN = TritonKernel(chain_speculative_sampling_kernel, **FOUR_WARPS)
MAIN_FROM_LOGITS = TritonKernel(chain_speculative_sampling_kernel, **FROM_LOGITS_OPTIONS)
MAIN_STEP = TritonKernel(chain_speculative_sampling_kernel, **FROM_LOGITS_STEP_OPTIONS)
# A flattened batch's: given no register cap, Triton 3.6's ptxas kept its bf16 variant to 72
# registers and spilled 8 bytes; with a cap of 128 it takes what it needs.
MAIN_FLATTENED = TritonKernel(chain_speculative_sampling_kernel, **build_options(4, maxnreg=128))
FIELDS = PARTIAL_FIELDS.value


def block_n(num_draft: int) -> int:
    """Lanes of the acceptance vector: N drafts and the bonus position, at least 4 (with 2, ptxas
    allocates more registers, which would cost a resident program per SM)."""
    return max(4, 1 << num_draft.bit_length())  # next power of 2 above N (triton's is slow)


@functools.lru_cache(maxsize=256)
def _per_shape(num_draft: int, vocab: int) -> tuple[int, int, int]:
    """(lanes of the acceptance vector, chunks of a row, position 0's coin's Philox slot)."""
    return block_n(num_draft), num_chunks(vocab), slots.coin_slot(vocab, 0)


def chain_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    programs: int | None = None,
    target_stats: torch.Tensor | None = None,
    draft_stats: torch.Tensor | None = None,
    flattened: Flattened | None = None,
    target_step: tuple[list, int] | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.chain_speculative_sampling_reference``: returns output_token_ids
    (B, N+1) int32 and adds to ``accepted_num`` / ``emitted_num`` in place.

    ``programs`` overrides the programs per request (tests use it to show the output does not
    depend on it); by default the launch model chooses it. With ``target_stats`` (and
    ``draft_stats``), target_probs (and draft_probs) hold logits, read through those rows'
    statistics (core/logits/launch.py). With ``flattened``, the batch is flattened
    (``specops.varlen``): its rows are read where they are, never copied. ``target_step``: the
    target logits' rule step 0 (``core/logits/launch.step_arguments``), applied as they are read.
    No host synchronisation. Every tensor it allocates is the call's own (safe on concurrent streams and
    in CUDA graphs).
    """
    rows = padded_rows if flattened is None else flattened.rows
    (batch, num_draft, num_tokens, cu, target_probs, (stride_tb, stride_tn), draft_probs,
     (stride_db, stride_dn), (stride_ib, stride_in)) = rows(draft_probs, draft_token_ids,
                                                            target_probs)
    vocab = target_probs.shape[-1]
    if draft_probs is None:
        draft_stats = None
    has_draft = draft_probs is not None
    draft = draft_probs if has_draft else target_probs  # a placeholder pointer when None
    device = target_probs.device
    out = torch.empty(batch, num_draft + 1, dtype=torch.int32, device=device)
    if batch == 0:
        return out
    stride_acc, stride_emit = accepted_num.stride()[0], emitted_num.stride()[0]
    seed_per_request = seed.numel() != 1
    seed_stride = seed.stride()[0] if seed_per_request else 0
    offset_stride = offset.stride()[0] if offset.numel() != 1 else 0
    lanes, chunks, coin_slot0 = _per_shape(num_draft, vocab)
    logits, draft_logits = target_stats is not None, draft_stats is not None
    no_stats = placeholder(device, torch.float64)
    no_arrivals = placeholder(device, torch.int32)
    target_stats = no_stats if target_stats is None else target_stats
    draft_stats = no_stats if draft_stats is None else draft_stats
    step_args, step_flags = kernel_step(target_step, device)
    constexprs = dict(HAS_DRAFT=has_draft, BLOCK_N=lanes, GROUP=GROUP, CHUNK=CHUNK_SIZE,
                      LOGITS=logits, DRAFT_LOGITS=draft_logits, BLOCK_P=MAX_PROGRAMS_PER_REQUEST,
                      VARLEN=flattened is not None, STEP=step_flags)
    main = (MAIN_STEP if step_flags else MAIN_FROM_LOGITS if logits
            else MAIN if flattened is None else MAIN_FLATTENED)
    # The plan's look-up runs before the partials exist: the placeholders have their dtypes.
    resources = main.resources(target_probs, draft, draft_token_ids, accepted_num, emitted_num,
                               seed, offset, out, no_stats, no_arrivals, target_stats,
                               draft_stats, cu, *step_args, num_draft, num_tokens, vocab,
                               stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in,
                               stride_acc, stride_emit, seed_stride, offset_stride,
                               int(seed_per_request), 1, coin_slot0, **constexprs)
    programs, per_program = occupancy.row_split(resources, batch, chunks,
                                                CHUNK_SIZE * target_probs.element_size(),
                                                MAX_PROGRAMS_PER_REQUEST, programs)
    if programs > 1:
        # The programs' partial results (kernel.py has the layout) and their arrival counts, which
        # start at zero (the request's last program to arrive combines the partials).
        partials = torch.empty(batch * programs * FIELDS, dtype=torch.float64, device=device)
        arrivals = torch.zeros(batch, dtype=torch.int32, device=device)
    else:
        partials, arrivals = no_stats, no_arrivals
    main.fn[(batch, programs)](
        target_probs, draft, draft_token_ids, accepted_num, emitted_num, seed, offset, out,
        partials, arrivals, target_stats, draft_stats, cu, *step_args, num_draft, num_tokens,
        vocab, stride_tb, stride_tn, stride_db, stride_dn, stride_ib, stride_in, stride_acc,
        stride_emit, seed_stride, offset_stride, int(seed_per_request), per_program, coin_slot0,
        **constexprs, **main.options)
    return out


# Verification from logits: every row's statistics, then the kernels above reading the logits.
chain_speculative_sampling_from_logits_triton = on_row_statistics(chain_speculative_sampling_triton)
