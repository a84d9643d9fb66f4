"""The sampling math every sampler shares, each in torch and as its Triton twin: Philox randomness,
the chunked exponential race, exact sums of chunk masses, reading probabilities, and a flattened
batch as the padded batch it stands for."""
