"""What the sampler takes: one row per sequence being sampled, each with its own parameters and
generator, as arrays; built by the engine (engine/sampling_rows.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_F32 = np.float32


@dataclass
class SamplingBatch:
    """One row per sequence being sampled; built by the engine."""

    temperature: np.ndarray  # [N] float32, < 1e-5 = greedy
    top_p: np.ndarray  # [N] float32, >= 1 = off
    top_k: np.ndarray  # [N] int32, <= 0 = off
    min_p: np.ndarray  # [N] float32, <= 0 = off
    presence_penalty: np.ndarray  # [N] float32
    frequency_penalty: np.ndarray  # [N] float32
    repetition_penalty: np.ndarray  # [N] float32, 1 = off
    output_token_ids: list[np.ndarray]  # per row, int64, tokens generated so far
    prompt_token_ids: list[np.ndarray]  # per row, int64
    generators: list[np.random.Generator]
    banned_token_ids: list[np.ndarray | None] = field(default_factory=list)  # e.g. EOS under min_tokens
    num_logprobs: np.ndarray | None = None  # [N] int32, -1 = none; None = none for every row
    # Structured output: packed allowed-token bits (int32, bit t%32 of word t//32) for the rows listed.
    allowed_tokens: np.ndarray | None = None  # [C, ceil(V/32)] int32; None = no row is constrained
    allowed_rows: np.ndarray | None = None  # [C] int64 row indices, the rows allowed_tokens applies to
    # logit_bias of every row, flattened: (row, token id, bias) triples, each (row, token) at most once.
    bias_rows: np.ndarray | None = None  # [B] int64; None = no row is biased
    bias_ids: np.ndarray | None = None  # [B] int64
    bias_values: np.ndarray | None = None  # [B] float32

    def __post_init__(self) -> None:
        n = len(self.temperature)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=_F32).reshape(n))
        self.top_k = np.asarray(self.top_k, dtype=np.int32).reshape(n)
        if self.num_logprobs is None:
            self.num_logprobs = np.full(n, -1, dtype=np.int32)
        self.num_logprobs = np.asarray(self.num_logprobs, dtype=np.int32).reshape(n)
        if not self.banned_token_ids:
            self.banned_token_ids = [None] * n
        if self.allowed_tokens is not None:
            self.allowed_rows = np.asarray(self.allowed_rows, dtype=np.int64).reshape(-1)
            if self.allowed_tokens.ndim != 2 or len(self.allowed_tokens) != len(self.allowed_rows):
                raise ValueError("SamplingBatch.allowed_tokens needs one row per entry of allowed_rows")
        for name in ("output_token_ids", "prompt_token_ids", "generators", "banned_token_ids"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"SamplingBatch.{name} has {len(getattr(self, name))} rows, expected {n}")

    @property
    def num_rows(self) -> int:
        return len(self.temperature)
