"""nvllm: vLLM's core on NumPy, served over gRPC on edge boards."""

__version__ = "0.1.0"
