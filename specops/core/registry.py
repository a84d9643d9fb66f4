"""Registering a draft-verification sampler as a torch op: schema, kernels per device, fake.

Every verifier of a chain of drafts (token verification, block verification) takes the same
arguments and returns output_token_ids (B, N + 1) int32, so they share one schema and one eager
entry: argument checks, the optional value checks, then the backend ``SPECOPS_BACKEND`` selects.

The op is a ``torch.library.custom_op``: what ``torch.compile``, ``opcheck`` and CUDA graphs see.
Its Python wrappers cost several bare launches of host time per call, so the public functions call
``run`` directly when nothing traces the call (docs/decisions.md, "Host path").
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
    def run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
            names: ArgumentNames = OP_NAMES):
        # The counters change in place: tell autograd, as an in-place torch op would (custom_op
        # bumps them too on the op's path; a second bump is harmless: autograd asks "changed?").
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

    op = torch.library.custom_op(
        qualname,
        kernel,
        mutates_args=("accepted_num", "emitted_num"),
        device_types=("cpu", "cuda"),
        schema=VERIFIER_SCHEMA,
    )
    op.register_fake(fake)
    namespace, name = qualname.split("::")
    return Verifier(op=getattr(getattr(torch.ops, namespace), name).default, run=run)
