"""The log-probabilities of the tokens a verifier from logits emits (docs/semantics.md,
"Logprobs"), shared by every layout: the plain rule (``rule.py``), its CPU backend (``cpu.py``)
and Triton launcher (``launch.py``, which reads the logits through the statistics the verifiers'
kernels use), what those two share (``tokens.py``), the registered op (``op.py``) and the public
functions' arguments and calls (``outputs.py``; each layout maps its outputs to rows in its own
``logprobs.py``)."""
