"""Registering and calling ops: ``register_op``, backend choice (``SPECOPS_BACKEND``), the pieces of
argument checks and seed/offset resolution."""
