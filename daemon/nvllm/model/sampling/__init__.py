"""The steps of sampler.sample(), one module each: penalties, truncation, draws, logprobs."""
