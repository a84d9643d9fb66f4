"""Triton kernels of specops (imported lazily by ``specops.op``: importing triton is not free)."""
