"""What every sampler shares: randomness (Philox, in torch and Triton), the chunked exponential-race
row sampler, seed/offset resolution, argument checks, backend choice and op registration."""
