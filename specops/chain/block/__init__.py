"""Block verification of a chain (Sun et al. 2024): registered op (``op``), plain reference
(``reference``), Triton kernels (``kernel``) and their launcher (``launch``), Philox slot layout
(``slots``). docs/block.md states the algorithm and why it is exact."""
