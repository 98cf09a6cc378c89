"""nvllm: vLLM's core on NumPy, served over gRPC on edge boards."""

from typing import Any

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
