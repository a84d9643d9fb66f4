"""A verifier of a chain of drafts as a registered op: token and block verification take the same
arguments and return output_token_ids (B, N + 1) int32, so they share one schema, one fake and one
eager entry (argument checks, the optional value checks, then the backend).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..core.checks import validation_enabled
from ..core.registry import Backends, RegisteredOp, register_op
from .arguments import (OP_NAMES, ArgumentNames, check_arguments, check_counters_apart,
                        check_values)

# Spelled out rather than inferred: the inferred schema would name the aliases a3!/a4!.
# `deterministic` is accepted for FlashInfer compatibility: every backend is reproducible.
SCHEMA = (
    "(Tensor? draft_probs, Tensor draft_token_ids, Tensor target_probs, "
    "Tensor(a!) accepted_num, Tensor(b!) emitted_num, Tensor seed, Tensor offset, "
    "bool deterministic=True) -> Tensor"
)


class Verifier(NamedTuple):
    """A registered verifier: the op, and its eager entry for arguments already checked."""

    registered: RegisteredOp
    # run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
    #     names=OP_NAMES, plain_eager=False): value checks when enabled, then the selected
    #     backend; plain_eager: the public function's call that nothing records (the launchers
    #     may then keep scratch between calls).
    run: Callable[..., torch.Tensor]


def register_verifier(qualname: str, backends: Backends) -> Verifier:
    """Register ``torch.ops.<qualname>`` with the verifier schema; return the op and its eager
    entry. Each backend takes the seven tensor arguments of the schema."""

    def run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
            names: ArgumentNames = OP_NAMES, plain_eager: bool = False):
        # The counters change in place: tell autograd, as an in-place torch op would (a kernel
        # writes them behind torch's back; on the op's path custom_op bumps them too, harmlessly).
        torch._C._increment_version((accepted_num, emitted_num))
        if validation_enabled():
            check_values(draft_probs, draft_token_ids, target_probs, names)
        return backends.run(target_probs.device, draft_probs, draft_token_ids, target_probs,
                            accepted_num, emitted_num, seed, offset, plain_eager=plain_eager)

    def checked(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                offset):
        check_arguments(draft_probs=draft_probs, draft_token_ids=draft_token_ids,
                        target_probs=target_probs, accepted_num=accepted_num,
                        emitted_num=emitted_num, seed=seed, offset=offset)
        check_counters_apart(accepted_num=accepted_num, emitted_num=emitted_num)

    def kernel(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
               deterministic=True):
        checked(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                offset)
        return run(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                   offset)

    def fake(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed, offset,
             deterministic=True):
        checked(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num, seed,
                offset)
        batch, num_draft = draft_token_ids.shape
        return target_probs.new_empty((batch, num_draft + 1), dtype=torch.int32)

    registered = register_op(qualname, SCHEMA, kernel=kernel, fake=fake,
                             mutates_args=("accepted_num", "emitted_num"))
    return Verifier(registered=registered, run=run)
