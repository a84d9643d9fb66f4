"""Registering a draft-verification sampler as a torch op: schema, kernels per device, fake.

Every verifier of a chain of drafts (token verification, block verification) takes the same
arguments and returns output_token_ids (B, N + 1) int32, so they share one schema and one eager
entry: argument checks, the optional value checks, then the backend ``SPECOPS_BACKEND`` selects.

The op is defined with ``torch.library.Library`` rather than ``torch.library.custom_op``: the
dispatcher then calls the kernel directly (autograd's fallback in C++; the counters' version bumps
in the kernel), instead of through custom_op's Python wrappers, a large part of a call's host time
(docs/performance.md, "Host time per call").
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .backends import selected_backend, triton_unavailable_error
from .checks import (OP_NAMES, ArgumentNames, check_arguments, check_counters_apart,
                     check_values, validation_enabled)

# Spelled out rather than inferred: the inferred schema would name the aliases a3!/a4!.
# `deterministic` is accepted for FlashInfer compatibility: every backend is reproducible.
VERIFIER_SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, "
    "Tensor(a!) accepted_num, Tensor(b!) emitted_num, Tensor seed, Tensor offset, "
    "bool deterministic=True) -> Tensor"
)

# A registration lasts as long as its Library object.
_LIBRARIES: list[torch.library.Library] = []


class Verifier(NamedTuple):
    """A registered verifier: the op, and its eager entry for arguments already checked."""

    op: torch._ops.OpOverload
    # run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
    #     names=OP_NAMES): value checks when enabled, then the selected backend.
    run: Callable[..., torch.Tensor]


def register_verifier(
    qualname: str,
    *,
    reference: Callable,
    cpu: Callable,
    triton: Callable[[], Callable],
) -> Verifier:
    """Register ``torch.ops.<qualname>`` with the verifier schema; return the op and its eager entry.

    reference: the plain implementation (the torch backend on devices other than the CPU);
    cpu: the CPU backend; triton: returns the Triton launcher (imported on first use, since
    importing triton is not free). Each takes the seven tensor arguments of the schema.
    """
    namespace, name = qualname.split("::")

    def run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
            names: ArgumentNames = OP_NAMES):
        # The counters change in place: tell autograd, as an in-place torch op would (a second
        # bump by a backend's own in-place add is harmless: autograd only asks "changed?").
        torch._C._increment_version((accepted_num, emitted_num))
        if validation_enabled():
            check_values(draft_probs, draft_token_ids, target_probs, names)
        device = target_probs.device
        if selected_backend(device) == "triton":
            try:
                return triton()(draft_probs, draft_token_ids, target_probs, accepted_num,
                              emitted_num, seed, offset)
            except RuntimeError as error:
                if "active drivers" in str(error):
                    raise triton_unavailable_error(device) from error
                raise
        implementation = cpu if device.type == "cpu" else reference
        return implementation(draft_probs, draft_token_ids, target_probs, accepted_num,
                              emitted_num, seed, offset)

    def kernel(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
               deterministic=True):
        check_arguments(draft_probs=draft_probs, draft_token_ids=draft_token_ids,
                        target_probs=target_probs, accepted_num=accepted_num,
                        emitted_num=emitted_num, seed=seed, offset=offset)
        check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num)
        return run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                   offset)

    def fake(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
             deterministic=True):
        check_arguments(draft_probs=draft_probs, draft_token_ids=draft_token_ids,
                        target_probs=target_probs, accepted_num=accepted_num,
                        emitted_num=emitted_num, seed=seed, offset=offset)
        check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num)
        batch, num_draft = draft_token_ids.shape
        return target_probs.new_empty((batch, num_draft + 1), dtype=torch.int32)

    library = torch.library.Library(namespace, "FRAGMENT")
    library.define(name + VERIFIER_SCHEMA, tags=(torch.Tag.pt2_compliant_tag,))
    library.impl(name, kernel, "CPU")
    library.impl(name, kernel, "CUDA")
    library.m.register_ad_inplace_or_view_fallback(name)  # `run` bumps the counters' versions
    torch.library.register_fake(qualname, fake, lib=library)
    _LIBRARIES.append(library)
    return Verifier(op=getattr(getattr(torch.ops, namespace), name).default, run=run)
