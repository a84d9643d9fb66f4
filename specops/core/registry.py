"""Registering a sampler as a torch op, and the one rule for skipping the dispatcher.

Every op is a ``torch.library.custom_op`` with a fake implementation: what ``torch.compile``,
``opcheck``, exported programs and CUDA graphs see. Its kernel serves every device; inside it the
backend is chosen (``backends.py``: ``SPECOPS_BACKEND``), and a kernel a user registers for a device
with ``torch.library.register_kernel`` replaces it on that device, as custom_op does for any op.

A call of the registered op pays custom_op's Python layers (docs/performance.md, "Host time per
call"). A public function may skip them when nothing but eager execution can see the call and no
user kernel is registered for the device (``skips_dispatcher``): it then runs the op's own eager
entry, the same checks and backends the op's kernel runs. That rule lives here, once, for every
sampler.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .backends import device_type, selected_backend, triton_unavailable_error

_FUNCTORCH_ACTIVE = torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode
_PLAIN = torch.Tensor


def is_plain_eager(*values) -> bool:
    """Whether nothing but eager execution can see a call with these arguments: every tensor among
    them a plain torch.Tensor, and no compiler, dispatch or function mode, functorch transform or
    TorchScript tracer active. Anything that may record or reinterpret the call (Dynamo, make_fx,
    fake tensors, vmap, grad, jit.trace, subclasses) must see the registered op."""
    for value in values:
        if type(value) is not _PLAIN and isinstance(value, torch.Tensor):
            return False
    return not (torch.compiler.is_compiling()
                or torch._C._len_torch_dispatch_stack()
                or torch._C._len_torch_function_stack()
                or torch._C._dispatch_tls_is_dispatch_key_included(_FUNCTORCH_ACTIVE)
                or torch._C._get_tracing_state() is not None)


class Backends(NamedTuple):
    """A sampler's implementations, by backend: ``reference`` (the plain one; the torch backend on
    devices other than the CPU), ``cpu`` (the torch backend on CPU tensors) and ``triton`` (returns
    the Triton launcher, imported on first use since importing triton is not free)."""

    reference: Callable
    cpu: Callable
    triton: Callable[[], Callable]

    def run(self, device: torch.device, *args, **triton_options):
        """The backend ``SPECOPS_BACKEND`` selects for tensors on ``device``, called on ``args``
        (and the Triton launcher on ``triton_options`` too). The Triton launchers launch on the
        current CUDA device, so tensors on another one are served with it made current for the
        call, as a torch operation would be (a launch there would read another GPU's memory)."""
        if selected_backend(device) == "triton":
            try:
                launcher = self.triton()
                if device_type(device) == "cuda" and device.index != torch.cuda.current_device():
                    with torch.cuda.device(device):
                        return launcher(*args, **triton_options)
                return launcher(*args, **triton_options)
            except RuntimeError as error:
                if "active drivers" in str(error):
                    raise triton_unavailable_error(device) from error
                raise
        return (self.cpu if device_type(device) == "cpu" else self.reference)(*args)


class RegisteredOp(NamedTuple):
    """A registered op: its overload, and the device types a user registered a kernel of their
    own for (``torch.library.register_kernel``), which the public functions then call through."""

    op: torch._ops.OpOverload
    user_kernels: set


def register_op(qualname: str, schema: str, *, kernel: Callable, fake: Callable,
                mutates_args: tuple[str, ...]) -> RegisteredOp:
    """``torch.ops.<qualname>``: a custom_op whose ``kernel`` serves every device until a user
    registers another for a device, and whose ``fake`` serves tracing."""
    definition = torch.library.custom_op(qualname, kernel, mutates_args=mutates_args,
                                         schema=schema)
    definition.register_fake(fake)
    user_kernels: set = set()
    register_kernel = definition.register_kernel

    # torch.library.register_kernel registers through this method of the op's definition: noting
    # the device types here lets the public functions honour the user's kernel too.
    def noting_register_kernel(device_types, fn=None, /):
        user_kernels.update([device_types] if isinstance(device_types, str) or device_types is None
                            else device_types)
        return register_kernel(device_types, fn)

    definition.register_kernel = noting_register_kernel
    namespace, name = qualname.split("::")
    return RegisteredOp(getattr(getattr(torch.ops, namespace), name).default, user_kernels)


def skips_dispatcher(registered: RegisteredOp, device: torch.device, *values) -> bool:
    """The public functions' rule: run the op's eager entry directly when nothing but eager
    execution can see the call (``is_plain_eager``) and no user kernel serves ``device``."""
    user = registered.user_kernels
    if user and (device.type in user or None in user):  # None: a kernel for every device
        return False
    return is_plain_eager(*values)
