"""Registering a sampler as a torch op: ``register_op``, the one helper every sampler uses.

Every op is a ``torch.library.custom_op`` with a fake implementation: what ``torch.compile``,
``opcheck``, exported programs and CUDA graphs see. Its kernel serves every device; inside it the
backend is chosen (``backends.py``: ``SPECOPS_BACKEND``). Every call, the public functions'
included, goes through the dispatcher, so a kernel a user registers for a device
(``torch.library.register_kernel`` or ``torch.library.impl``) serves that device's calls.
"""

from __future__ import annotations

import importlib
from typing import Callable, NamedTuple

import torch

from .backends import device_type, selected_backend, triton_unavailable_error
from .checks import validation_enabled


class Backends(NamedTuple):
    """A sampler's implementations, by backend: ``reference`` (the plain one; the torch backend on
    devices other than the CPU), ``cpu`` (the torch backend on CPU tensors) and ``triton`` (returns
    the Triton launcher, imported on first use since importing triton is not free)."""

    reference: Callable
    cpu: Callable
    triton: Callable[[], Callable]

    def run(self, device: torch.device, *args):
        """The backend ``SPECOPS_BACKEND`` selects for tensors on ``device``, called on ``args``.
        The Triton launchers launch on the current CUDA device, so tensors on another one are
        served with it made current for the call, as a torch operation would be (a launch there
        would read another GPU's memory)."""
        if selected_backend(device) == "triton":
            try:
                launcher = self.triton()
                if device_type(device) == "cuda" and device.index != torch.cuda.current_device():
                    with torch.cuda.device(device):
                        return launcher(*args)
                return launcher(*args)
            except RuntimeError as error:
                if "active drivers" in str(error):
                    raise triton_unavailable_error(device) from error
                raise
        return (self.cpu if device_type(device) == "cpu" else self.reference)(*args)


def imported_on_first_use(module: str, name: str) -> Callable[[], Callable]:
    """A ``Backends.triton``: the launcher ``name`` of ``module``, imported on the first call
    (importing triton is not free) and read from the module at every call, so that a replaced
    launcher (tests monkeypatch it) is the one called."""
    def launcher() -> Callable:
        return getattr(importlib.import_module(module), name)
    return launcher


def register_op(qualname: str, schema: str, *, check: Callable, check_values: Callable,
                backends: Backends, outputs: Callable, mutates_args: tuple[str, ...] = (),
                backend_arguments: int | None = None,
                counts: tuple[int, Callable] | None = None) -> torch._ops.OpOverload:
    """Define ``torch.ops.<qualname>`` (``schema``) and return its overload.

    ``check``, ``check_values`` and ``outputs`` take the schema's arguments in order (trailing
    ones left at their defaults may be absent, as the dispatcher passes them). The kernel runs
    ``check`` (shapes, dtypes, devices: errors name the argument), ``check_values`` when
    SPECOPS_VALIDATE=1, then the selected backend on the first ``backend_arguments`` arguments
    (None: all of them). The fake runs ``check`` too, so that bad input raises the same error at
    trace time, and returns ``outputs``' empty tensors. custom_op bumps the versions of the
    ``mutates_args`` tensors on every call, so autograd sees them change.

    ``counts`` = (index, batch_size): the op returns (tokens, accepted, emitted), this call's
    counts (B,) int32, where its backends add to two counters in place: the kernel passes them
    new zeros, inserted at ``index`` of the arguments, B = ``batch_size(*args)``. (custom_op runs
    a mutating op through a Python kernel whose cost grows with the square of the schema's
    length: docs/internals/decisions.md.)
    """

    def kernel(*args):
        check(*args)
        if validation_enabled():
            check_values(*args)
        # check has put every tensor on one device: the first one's.
        device = next(arg.device for arg in args if isinstance(arg, torch.Tensor))
        if counts is None:
            return backends.run(device, *args[:backend_arguments])
        index, batch_size = counts
        accepted, emitted = (torch.zeros(batch_size(*args), dtype=torch.int32, device=device)
                             for _ in range(2))
        tokens = backends.run(device, *args[:index], accepted, emitted,
                              *args[index:backend_arguments])
        return tokens, accepted, emitted

    def fake(*args):
        check(*args)
        return outputs(*args)

    definition = torch.library.custom_op(qualname, kernel, mutates_args=mutates_args,
                                         schema=schema)
    definition.register_fake(fake)
    namespace, name = qualname.split("::")
    return getattr(getattr(torch.ops, namespace), name).default
