"""The model the registry tests pull: SmolLM2-135M-Instruct, as KNOWN_MODELS names and describes it."""

from __future__ import annotations

from nvllm.model_files.registry import KNOWN_MODELS

NAME = "smollm2-135m-instruct"
SRC = KNOWN_MODELS[NAME]
