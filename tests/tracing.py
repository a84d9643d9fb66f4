"""Bad input raising the same error eagerly, under fake tensors and at trace time: what a call
that must fail raised, for tests/test_validation.py and test_tree_validation.py."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode


def errors_while_tracing(function, *args, raises=Exception) -> list[BaseException]:
    """Compile ``function`` (fullgraph, aot_eager) and call it on ``args``: it must raise
    ``raises`` while tracing, before any graph reaches the backend. Returns that exception and its
    chain of causes: Dynamo wraps the original error, differently in different torch releases."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(function, fullgraph=True, backend=counter)
    with pytest.raises(raises) as info:
        compiled(*args)
    assert counter.frame_count == 0
    chain, error = [], info.value
    while error is not None and len(chain) < 20:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def with_one_changed(args: dict, order: list, name: str, value) -> list:
    """``args`` in ``order``, ``args[name]`` replaced by ``value``."""
    return [value if key == name else args[key] for key in order]


def message_of(exc, function, *args) -> str:
    """The message of the ``exc`` that ``function(*args)`` must raise."""
    with pytest.raises(exc) as info:
        function(*args)
    return str(info.value)


def assert_same_error_under_fake_tensors(function, args, exc, message) -> None:
    """``function`` on fake copies of ``args`` raises ``exc`` with ``message``: the fake
    implementation checks as the eager one does."""
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        assert message_of(exc, function, *fake) == message


def assert_same_error_under_compile(function, args, exc, message) -> None:
    """``function`` compiled raises while tracing, and the eager ``exc`` with the eager
    ``message`` is in the chain of causes (raised by the fake implementation)."""
    chain = errors_while_tracing(lambda *a: function(*a), *args,
                                 raises=torch._dynamo.exc.TorchRuntimeError)
    original = [e for e in chain if type(e) is exc]
    assert original and str(original[0]) == message, [repr(e) for e in chain]
