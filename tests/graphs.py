"""CUDA-graph capture as the GPU tests do it: the first calls on a side stream, then a capture."""

from __future__ import annotations

import torch


def warm_up(*steps) -> list:
    """Call each step once on a side stream, as capture requires of a call's first run (kernel
    compilation, allocator pools); what they returned."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        results = [step() for step in steps]
    torch.cuda.current_stream().wait_stream(stream)
    return results


def capture(step, generator: torch.Generator | None = None):
    """(a CUDA graph of ``step()``, what it returned: tensors that every replay rewrites), with
    ``generator``'s state registered with the graph when given. Capture raises where the step
    synchronises with the host."""
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        output = step()
    return graph, output
