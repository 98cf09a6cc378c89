"""The steps of nvllm.model.sampler.sample(), one module each: penalties, truncation, draws, logprobs."""
