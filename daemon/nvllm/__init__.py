"""nvllm: vLLM's core on NumPy, served over gRPC on edge boards."""

import os
from typing import Any

# OpenBLAS's threads spin for about 2^28 cycles after each call before they sleep. The model's products
# run on nvllm's own thread pool, so BLAS's spinners (left by prefill's attention) took the cores from
# it: on 2 cores a 14-token prefill of the 1.5B took 307 ms with them and 183 ms with this, a 512-token
# prefill of the 0.5B Q8_0 254 -> 426 tokens/s. 2^4 cycles, then sleep. Read when OpenBLAS loads (with
# NumPy), so it is set before anything imports NumPy; a value the environment gives is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import nvllm` (the CLI, the stubs) does not pull in the whole engine.
    if name == "LLM":
        from nvllm.llm import LLM
        return LLM
    if name == "SamplingParams":
        from nvllm.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(name)
