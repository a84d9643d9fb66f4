"""Tree speculative sampling (docs/tree.md, "Tree verification"): verifying a tree of drafts
exactly, with the draft probabilities (multi-round rejection sampling, with or without
replacement) or target-only. Its plain reference, CPU backend, Triton kernel and launcher, Philox
slots, argument checks, registered op, and ``adapters`` for engines' tree layouts."""
