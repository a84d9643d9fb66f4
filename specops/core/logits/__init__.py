"""Logits made into each request's distribution (verification from logits): the plain rule
(``rule.py``), the CPU backends' way to the same rows, its Triton twin and its launcher."""
