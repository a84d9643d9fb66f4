"""What a call that must fail at trace time raised: for the tests that bad input raises the same
error under torch.compile as eagerly (tests/test_validation.py, test_tree_validation.py)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend


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
