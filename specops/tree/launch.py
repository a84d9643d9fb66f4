"""Launching the tree kernel, and the traversal kernel for traversal verification with draft
probabilities: the three outputs, then one ``kernel[grid]`` launch of grid (B,). One program walks
one request's tree, so there is no launch plan to make and no partials to
combine (docs/internals/performance.md, "Tree verification", says why). From logits, the rows'
statistics first (``core/logits/launch.py``); the kernels read the logits through them."""

from __future__ import annotations

import torch

from ..core.launch.launcher import FOUR_WARPS, TritonKernel, build_options, placeholder
from ..core.logits.launch import (FROM_LOGITS_STEP_OPTIONS, given_or_off, row_statistics,
                                  step_arguments)
from ..core.logits.rule import ORDERS, drafts_own, optional_arguments
from ..core.sampling.race import CHUNK_SIZE
from ..core.sampling.values_triton import ONE_HOT
from . import slots
from .kernel import tree_speculative_sampling_kernel
from .processed import paths
from .traversal_kernel import tree_traversal_kernel

# Chunks whose masses a program holds at once (one float32 per thread and race at 4 warps).
GROUP = 128
# tests/sass.py compiles the kernels with their options, read from these.
KERNEL = TritonKernel(tree_speculative_sampling_kernel, **FOUR_WARPS)
TRAVERSAL = TritonKernel(tree_traversal_kernel, **FOUR_WARPS)
# Reading logits, built as the chain kernels that read them (core/logits/launch.py): 2 warps,
# and with rule step 0 applied as the rows are read 4 warps under a cap of 255 registers. At 2
# warps ptxas otherwise keeps the tree kernel to 96 registers and spills; with a program per
# request, its registers cost no occupancy that matters.
FROM_LOGITS = build_options(2, maxnreg=255)
KERNEL_FROM_LOGITS = TritonKernel(tree_speculative_sampling_kernel, **FROM_LOGITS)
TRAVERSAL_FROM_LOGITS = TritonKernel(tree_traversal_kernel, **FROM_LOGITS)
KERNEL_STEP = TritonKernel(tree_speculative_sampling_kernel, **FROM_LOGITS_STEP_OPTIONS)
TRAVERSAL_STEP = TritonKernel(tree_traversal_kernel, **FROM_LOGITS_STEP_OPTIONS)


def block_m(num_nodes: int) -> int:
    """Lanes of the node vectors: the M nodes and the M + 1 output positions, at least 16."""
    return max(16, 1 << num_nodes.bit_length())  # the next power of 2 above M


def tree_speculative_sampling_triton(
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    target_probs: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    with_replacement: bool = True,
    verification: str = "token",
):
    """Same contract as ``reference.tree_speculative_sampling_reference``. No host
    synchronisation; the outputs are its only allocations (safe on concurrent streams and in CUDA
    graphs)."""
    if verification == "traversal" and draft_probs is not None:
        return tree_traversal_triton(draft_probs, draft_token_ids, parents, target_probs, seed,
                                     offset, with_replacement)
    return launch(KERNEL, draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                  with_replacement, HAS_DRAFT=draft_probs is not None)


def launch(kernel: TritonKernel, draft_probs, draft_token_ids, parents, target_probs, seed,
           offset, with_replacement, target_stats=None, draft_stats=None, step=None,
           **constexprs):
    """The three outputs, then one launch of grid (B,) of ``kernel``: the tree kernel, or the
    traversal kernel (traversal_kernel.py), which take the same arguments. From logits: the
    statistics of the target's rows and of the draft's (given with LOGITS and DRAFT_LOGITS), and
    ``step``, the kernels' arguments of rule step 0 (``step_arguments`` of the tree's
    ``paths``; None: off)."""
    batch, num_nodes = draft_token_ids.shape
    vocab = target_probs.shape[2]
    device = target_probs.device
    if target_probs.stride(2) != 1:  # the row passes need unit vocabulary stride (16-byte loads)
        target_probs = target_probs.contiguous()
    if draft_probs is not None and draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()
    out_tokens = torch.empty((batch, num_nodes + 1), dtype=torch.int32, device=device)
    out_nodes = torch.empty((batch, num_nodes), dtype=torch.int32, device=device)
    emitted = torch.empty((batch,), dtype=torch.int32, device=device)
    if batch == 0:
        return out_tokens, out_nodes, emitted
    draft = target_probs if draft_probs is None else draft_probs  # None: never read
    stride_tb, stride_tn, _ = target_probs.stride()
    stride_db, stride_dn = draft.stride()[:2]
    stride_ib, stride_in = draft_token_ids.stride()
    stride_pb, stride_pn = parents.stride()
    seed_stride = 0 if seed.numel() == 1 else seed.stride(0)
    offset_stride = 0 if offset.numel() == 1 else offset.stride(0)
    no_stats = placeholder(device, torch.float64)
    step_args, flags = given_or_off(step, device)
    kernel.fn[(batch,)](
        target_probs, draft, draft_token_ids, parents, seed, offset, out_tokens, out_nodes,
        emitted, no_stats if target_stats is None else target_stats,
        no_stats if draft_stats is None else draft_stats, *step_args, num_nodes, vocab, stride_tb,
        stride_tn, stride_db, stride_dn, stride_ib, stride_in, stride_pb, stride_pn, seed_stride,
        offset_stride, int(seed.numel() != 1),
        int(with_replacement), slots.slots_per_draw(vocab), BLOCK_M=block_m(num_nodes),
        GROUP=GROUP, CHUNK=CHUNK_SIZE, STEP=flags, **constexprs, **kernel.options)
    return out_tokens, out_nodes, emitted


def tree_traversal_triton(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                          with_replacement=True):
    """Traversal verification with draft probabilities: the same contract as
    ``traversal_reference.verify``, launched as the tree kernel is."""
    return launch(TRAVERSAL, draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                  with_replacement)


def tree_speculative_sampling_from_logits_triton(
        draft_probs, draft_token_ids, parents, target_logits, draft_logits, seed, offset,
        temperature, top_k, top_p, min_p, with_replacement=True, *rest):
    """Same contract as ``reference.tree_speculative_sampling_from_logits_reference``: every
    row's statistics, then the tree kernel (or the traversal kernel) reading the logits through
    them, rule step 0 applied to the target's as they are read, each node's path counted as
    generated (``paths``, built only with penalties). No processed rows are written."""
    draft_parameters, step, order, verification = optional_arguments(rest)
    min_p_last = ORDERS[order]
    parameters = (temperature, top_k, top_p, min_p)
    num_nodes = draft_token_ids.shape[1]
    target_step = None
    if step.changes_logits():  # without penalties nothing counts: the ids are never read
        counted = (draft_token_ids if step.penalties() is None else
                   paths(draft_token_ids, parents, target_logits.shape[-1]))
        target_step = step_arguments(step, counted, target_logits.device, num_nodes)
    if target_logits.stride(2) != 1:  # 16-byte row loads
        target_logits = target_logits.contiguous()
    target_stats = row_statistics(target_logits, *parameters, min_p_last=min_p_last,
                                  step=target_step)
    draft_rows, draft_stats = draft_probs, None  # the draft's rows: probabilities, or logits
    if draft_logits is not None:  # by the draft's own parameters, each None the target's
        draft_rows = draft_logits if draft_logits.stride(2) == 1 else draft_logits.contiguous()
        draft_stats = row_statistics(draft_rows, *drafts_own(draft_parameters, parameters),
                                     min_p_last=min_p_last)
    traversal = draft_rows is not None and tuple(verification) == ("traversal",)
    kernel = ((TRAVERSAL_STEP if traversal else KERNEL_STEP) if target_step is not None else
              TRAVERSAL_FROM_LOGITS if traversal else KERNEL_FROM_LOGITS)
    constexprs = dict(LOGITS=ONE_HOT.value,
                      DRAFT_LOGITS=ONE_HOT.value if draft_stats is not None else 0)
    if not traversal:  # the traversal kernel always reads draft rows
        constexprs["HAS_DRAFT"] = draft_rows is not None
    return launch(kernel, draft_rows, draft_token_ids, parents, target_logits, seed, offset,
                  with_replacement, target_stats, draft_stats, target_step, **constexprs)
