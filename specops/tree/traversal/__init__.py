"""Traversal verification of trees (docs/tree.md, "Traversal verification"): the plain reference,
the Triton kernel and its launcher; the CPU backend is the reference with tree/cpu.py's steps."""
