"""A sequence's token states -> one vector: the pooling a model's own files name (sentence-transformers'
modules in a folder, weights/pooling_files.py; a GGUF's pooling_type), then its Dense layers, then an L2
normalization where the model asks for one. `dimensions` (Matryoshka) cuts the vector before that
normalization, as vLLM does, so a shortened embedding is still a unit vector."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("mean", "cls", "last")


@dataclass(frozen=True)
class DenseLayer:
    """sentence-transformers' Dense module: activation(x @ weight.T + bias)."""
    weight: np.ndarray            # [out, in] float32
    bias: np.ndarray | None       # [out]
    activation: str = "identity"  # "identity" or "tanh"


@dataclass(frozen=True)
class Pooling:
    method: str = "cls"
    dense: tuple[DenseLayer, ...] = ()
    normalize: bool = True
    # Lengths the model was trained to be cut to (Matryoshka); () when it was not, and `dimensions` is refused.
    matryoshka: tuple[int, ...] = ()
    any_dimensions: bool = False  # the model takes any length up to its own (config's is_matryoshka)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"pooling method {self.method!r}: need one of {', '.join(METHODS)}")

    def size(self, hidden: int) -> int:
        """The pooled vector's length for token states of `hidden`."""
        return self.dense[-1].weight.shape[0] if self.dense else hidden

    def check_dimensions(self, dimensions: int, hidden: int) -> str:
        """Why `dimensions` cannot be given ("" when it can)."""
        full = self.size(hidden)
        if not (self.matryoshka or self.any_dimensions):
            return f"not supported by this model (it was not trained for shortened embeddings; it gives {full})"
        if not 1 <= dimensions <= full:
            return f"between 1 and the model's {full}"
        if self.matryoshka and not self.any_dimensions and dimensions not in self.matryoshka:
            return f"one of the model's Matryoshka sizes {', '.join(map(str, self.matryoshka))}"
        return ""

    def __call__(self, hidden: np.ndarray, starts: np.ndarray, lens: np.ndarray,
                 dimensions: list[int | None] | None = None) -> list[np.ndarray]:
        """hidden [T, H] float32 of packed sequences (rows starts[s] .. starts[s] + lens[s] - 1) -> one vector
        per sequence, each cut to dimensions[s] where given."""
        if self.method == "mean":
            pooled = np.stack([hidden[a:a + n].mean(axis=0, dtype=np.float32) for a, n in zip(starts, lens)]) \
                if len(starts) else hidden[:0]
        elif self.method == "cls":
            pooled = hidden[starts]
        else:
            pooled = hidden[starts + lens - 1]
        pooled = np.ascontiguousarray(pooled, dtype=np.float32)
        for layer in self.dense:
            pooled = pooled @ layer.weight.T
            if layer.bias is not None:
                pooled += layer.bias
            if layer.activation == "tanh":
                np.tanh(pooled, out=pooled)
        out = []
        for s, row in enumerate(pooled):
            d = dimensions[s] if dimensions else None
            row = row[:d] if d else row
            if self.normalize:
                # torch.nn.functional.normalize's rule: divide by max(norm, 1e-12)
                row = row / max(float(np.sqrt(np.dot(row, row))), 1e-12)
            out.append(row.astype(np.float32))
        return out
