"""Through the daemon: each KV cache format (--kv-cache-dtype) and each weight type issue 24 added (Q2_K,
Q3_K in Q3_K_M, IQ4_XS, IQ4_NL) serves a streamed answer equal to the offline engine's on the same file
and format, and Health names the pool's format."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from helpers.daemon_util import NUM_BLOCKS, DaemonProcess, health
from nvllm import LLM, SamplingParams
from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.writer import synthesize
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

# heads of 64 (q8_0's blocks divide them), rows of 256 (the K-quants' super-blocks fit every matrix)
SHAPE = Shape("fmt", "qwen2", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6, 1e-6, "qwen2", {1000: "<|endoftext|>"},
              bos=1000, eos=1000, bpe=1000)
CASES = [("Q8_0", "f32"), ("Q8_0", "f16"), ("Q8_0", "bf16"), ("Q8_0", "q8_0"),
         ("Q2_K", "f16"), ("Q3_K_M", "q8_0"), ("IQ4_XS", "f16"), ("IQ4_NL", "bf16")]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("formats")
    return {t: Path(synthesize(SHAPE, t, out / f"{t}.gguf")) for t in sorted({t for t, _ in CASES})}


@pytest.mark.parametrize("weights,kv", CASES)
def test_the_daemon_answers_as_the_engine_does(files, weights, kv, tmp_path) -> None:
    model = files[weights]
    ids = list(range(7, 47))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = LLM(model, num_blocks=NUM_BLOCKS, kv_cache_dtype=kv).generate([{"prompt_token_ids": ids}], params)[0]
    daemon = DaemonProcess(tmp_path, model, extra_args=("--kv-cache-dtype", kv))
    try:
        h = health(daemon.address)
        assert h.kv_cache_dtype == kv and h.page_bytes > 0
        req = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=ids),
                                 sampling_params=pb.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
        with grpc.insecure_channel(daemon.address) as channel:
            deltas = list(pb_grpc.GeneratorStub(channel).Generate(req, timeout=120))
        assert [t for d in deltas for t in d.token_ids] == want.token_ids
        assert deltas[-1].finish_reason == pb.FINISH_REASON_LENGTH
    finally:
        assert daemon.stop() == 0, daemon.log()
