"""``torch.ops.specops.tree_speculative_sampling``: tree verification, registered as a torch op."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.checks import validation_enabled
from ..core.registry import Backends, RegisteredOp, register_op
from .arguments import check_arguments, check_values
from .cpu import tree_speculative_sampling_cpu
from .reference import tree_speculative_sampling_reference

# Spelled out rather than inferred, so that the schema names its arguments as docs/api.md does.
SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor parents, Tensor target_probs, "
    "Tensor seed, Tensor offset, bool with_replacement=True) -> (Tensor, Tensor, Tensor)"
)

_launch = None


def _triton():
    # Imported on first use (importing triton is not free); read from the module at every call,
    # so that a replaced launcher (tests monkeypatch it) is the one called.
    global _launch
    if _launch is None:
        from . import launch as _launch
    return _launch.tree_speculative_sampling_triton


BACKENDS = Backends(reference=tree_speculative_sampling_reference,
                    cpu=tree_speculative_sampling_cpu, triton=_triton)


def run(draft_probs, draft_token_ids, parents, target_probs, seed, offset, with_replacement=True):
    """The eager entry, for arguments already checked: the value checks when enabled, then the
    backend ``SPECOPS_BACKEND`` selects. Returns (output_token_ids, output_node_ids, emitted)."""
    if validation_enabled():
        check_values(draft_probs, draft_token_ids, parents, target_probs)
    return BACKENDS.run(target_probs.device, draft_probs, draft_token_ids, parents, target_probs,
                        seed, offset, with_replacement)


def _kernel(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
            with_replacement=True):
    check_arguments(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                    with_replacement)
    return run(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
               with_replacement)


def _fake(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
          with_replacement=True):
    check_arguments(draft_probs, draft_token_ids, parents, target_probs, seed, offset,
                    with_replacement)
    batch, num_nodes = draft_token_ids.shape
    return (target_probs.new_empty((batch, num_nodes + 1), dtype=torch.int32),
            target_probs.new_empty((batch, num_nodes), dtype=torch.int32),
            target_probs.new_empty((batch,), dtype=torch.int32))


class TreeOp(NamedTuple):
    registered: RegisteredOp
    run: object


tree_speculative_sampling_op = TreeOp(
    register_op("specops::tree_speculative_sampling", SCHEMA, kernel=_kernel, fake=_fake,
                mutates_args=()),
    run)
