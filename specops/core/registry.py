"""Registering a draft-verification sampler as a torch op: schema, kernels per device, fake.

Every verifier of a chain of drafts (token verification, block verification) takes the same
arguments and returns output_token_ids (B, N + 1) int32, so they share one schema and one eager
entry: argument checks, the optional value checks, then the backend ``SPECOPS_BACKEND`` selects.

The op is a ``torch.library.custom_op``: what ``torch.compile``, ``opcheck`` and CUDA graphs see.
custom_op's Python wrappers (autograd, in-place version bump, backend check) cost several bare
launches of host time per call, so a plain eager call skips them: the public functions call ``run``
themselves, and the op's CPU and CUDA autograd keys hold a kernel that runs the op at once when
nothing but eager execution can see the call, and hands it on below autograd otherwise
(docs/decisions.md, "Host path").
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

_FUNCTORCH_ACTIVE = torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode
_PLAIN = torch.Tensor


def is_plain_eager(*values) -> bool:
    """Whether nothing but eager execution can see a call with these arguments: every tensor among
    them a plain torch.Tensor, and no compiler, dispatch or function mode, functorch transform or
    TorchScript tracer active (anything that may record the call must see the registered op)."""
    for value in values:
        if type(value) is not _PLAIN and isinstance(value, torch.Tensor):
            return False
    return not (torch.compiler.is_compiling()
                or torch._C._len_torch_dispatch_stack()
                or torch._C._len_torch_function_stack()
                or torch._C._dispatch_tls_is_dispatch_key_included(_FUNCTORCH_ACTIVE)
                or torch._C._get_tracing_state() is not None)


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
        # The counters change in place: tell autograd, as an in-place torch op would (on a
        # recorded call custom_op bumps them too; a second bump is harmless: autograd asks
        # "changed?", not "how often?").
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
        schema=VERIFIER_SCHEMA,
    )
    op.register_fake(fake)
    namespace, name = qualname.split("::")
    overload = getattr(getattr(torch.ops, namespace), name).default

    # Dynamo must not trace into these when an eager call happens inside a compiled region (as
    # custom_op's own wrappers are kept out of it).
    @torch._disable_dynamo
    def plain_eager_or_below_autograd(keyset, draft_probs, draft_token_ids, target_probs,
                                      accepted_num, emitted_num, seed, offset, deterministic=True):
        # The outputs are integers: there is no gradient to record, only the counters' versions
        # to bump, which run() does. With no input that requires grad, autograd has nothing to
        # record; with no key below autograd that may record or reinterpret the call (fake
        # tensors, make_fx and dispatch modes bring the Python key, functorch's grad and jvp
        # their back-mode key), the kernel runs here. Anything else goes on below autograd,
        # through custom_op's version bump, to those keys.
        if (keyset.raw_repr() & _INTERCEPTING_BITS == 0 and not target_probs.requires_grad
                and (draft_probs is None or not draft_probs.requires_grad)):
            return kernel(draft_probs, draft_token_ids, target_probs, accepted_num, emitted_num,
                          seed, offset)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & torch._C._after_autograd_keyset, draft_probs,
                                       draft_token_ids, target_probs, accepted_num, emitted_num,
                                       seed, offset, deterministic)

    # Runtime keys of their own: registering over custom_op's own keys is refused by older torch.
    shortcuts = torch.library.Library(namespace, "IMPL")
    for device in ("CPU", "CUDA"):
        shortcuts.impl(name, plain_eager_or_below_autograd, "Autograd" + device, with_keyset=True)
        shortcuts.impl(name, torch._disable_dynamo(kernel), device)
    _SHORTCUT_LIBRARIES.append(shortcuts)  # a registration lives as long as its library object
    return Verifier(op=overload, run=run)


_SHORTCUT_LIBRARIES: list = []


# Keys below autograd that change what a tensor is or record the call (functional, zero,
# conjugate or negative tensors, Python subclasses and modes, functorch's transform levels):
# their calls must reach those keys, not the kernel. None has a backend component, so a key set
# holds one of them exactly when its bits meet these.
_KEY = torch._C.DispatchKey
_INTERCEPTING_BITS = 0
for _key in (_KEY.Python, _KEY.PythonTLSSnapshot, _KEY.Functionalize, _KEY.ZeroTensor,
             _KEY.Conjugate, _KEY.Negative, _KEY.FuncTorchDynamicLayerBackMode):
    _INTERCEPTING_BITS |= torch._C.DispatchKeySet(_key).raw_repr()
