"""Registering a draft-verification sampler as a torch op: schema, kernels per device, fake.

Every verifier of a chain of drafts (token verification, block verification) takes the same
arguments and returns output_token_ids (B, N + 1) int32, so they share one schema and one eager
entry: argument checks, the optional value checks, then the backend ``SPECOPS_BACKEND`` selects.
"""

from __future__ import annotations

from typing import Callable

import torch

from .backends import selected_backend
from .checks import check_arguments, check_values, validation_enabled

# Spelled out rather than inferred: the inferred schema would name the aliases a3!/a4!.
# `deterministic` is accepted for FlashInfer compatibility: every backend is reproducible.
VERIFIER_SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, "
    "Tensor(a!) accepted_num, Tensor(b!) emitted_num, Tensor seed, Tensor offset, "
    "bool deterministic=True) -> Tensor"
)


def register_verifier(
    qualname: str,
    *,
    reference: Callable,
    cpu: Callable,
    triton: Callable[[], Callable],
):
    """Register ``torch.ops.<qualname>`` with the verifier schema and return its CustomOpDef.

    reference: the plain implementation (the torch backend on devices other than the CPU);
    cpu: the CPU backend; triton: returns the Triton launcher (imported on first use, since
    importing triton is not free). Each takes the seven tensor arguments of the schema.
    """

    def implementation(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                       seed, offset, deterministic=True):
        args = (draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset)
        check_arguments(*args)
        if validation_enabled():
            check_values(draft_probs, draft_token_ids, target_probs)
        device = target_probs.device
        if selected_backend(device) == "triton":
            return triton()(*args)
        return (cpu if device.type == "cpu" else reference)(*args)

    op = torch.library.custom_op(
        qualname,
        implementation,
        mutates_args=("accepted_num", "emitted_num"),
        device_types=("cpu", "cuda"),
        schema=VERIFIER_SCHEMA,
    )

    @op.register_fake
    def fake(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
             deterministic=True):
        check_arguments(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                        seed, offset)
        batch, num_draft = draft_token_ids.shape
        return target_probs.new_empty((batch, num_draft + 1), dtype=torch.int32)

    return op
