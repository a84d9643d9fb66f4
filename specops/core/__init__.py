"""What every sampler shares: the sampling math (``sampling/``), logits made into distributions
(``logits/``), registering and calling ops (``ops/``) and launching Triton kernels (``launch/``)."""
