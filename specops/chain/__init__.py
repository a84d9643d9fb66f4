"""Verifiers of a chain of drafts: ``token/`` (token verification, FlashInfer's rule) and ``block/``
(block verification), each with its plain reference, CPU backend, Triton kernel and launcher, and
what they share: the arguments and their checks (``arguments``), reading the drafts (``drafts``),
the output row and counters (``outputs``) and the registered op's schema (``verifier``)."""
