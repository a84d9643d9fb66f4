"""Token verification of a chain (Leviathan et al. 2023; Chen et al. 2023): registered op (``op``),
plain reference (``reference``), CPU backend (``cpu``), Triton kernel (``kernel``) and its launcher
(``launch``), Philox slot layout (``slots``)."""
