"""engine/assembly/factory.py: the one way an engine is built, for the daemon, LLM, generate and bench alike."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvllm import LLM, SamplingParams
from nvllm.config import ConfigError, load_settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import MemoryReading
from nvllm.sampling_params import InvalidParameter

GiB = 1 << 30


def settings_for(model: Path, **sections):
    return load_settings(overrides={"model": {"path": str(model)}, **sections})


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(changes)
    path.write_text(json.dumps(data))


class TestEosIds:
    def test_merged_from_tokenizer_config_and_generation_config(self, tiny_models):
        # tiny-qwen2: generation_config [2, 0]; config.json 2; tokenizer_config's <|im_end|> = 2
        loaded = factory.load_model(settings_for(tiny_models["tiny-qwen2"]))
        assert loaded.eos_token_ids == {0, 2}

    def test_every_file_adds_its_ids(self, tiny_models, tmp_path):
        folder = Path(shutil.copytree(tiny_models["tiny-llama"], tmp_path / "m"))
        edit_json(folder / "generation_config.json", eos_token_id=[5, 6])
        edit_json(folder / "config.json", eos_token_id=7)
        edit_json(folder / "tokenizer_config.json", eos_token={"content": "<|endoftext|>", "special": True})
        loaded = factory.load_model(settings_for(folder))
        assert loaded.eos_token_ids == {0, 5, 6, 7}
        engine = factory.create_engine(settings_for(folder, cache={"num_blocks": 32}), loaded,
                                       factory.plan_pool(settings_for(folder, cache={"num_blocks": 32}),
                                                         loaded.info, MemoryReading(GiB, "test")))
        assert engine.eos_token_ids == {0, 5, 6, 7}


class TestModelPath:
    def test_a_broken_generation_config_is_named(self, tiny_models, tmp_path):
        folder = Path(shutil.copytree(tiny_models["tiny-llama"], tmp_path / "m"))
        (folder / "generation_config.json").write_text("{not json")
        with pytest.raises(factory.EngineBuildError, match="generation_config.json"):
            factory.load_model(settings_for(folder))

    def test_a_missing_folder_is_one_clear_error(self, tmp_path):
        with pytest.raises(factory.EngineBuildError, match=r"nothing at .*nowhere.*nvllm models pull"):
            factory.load_model(settings_for(tmp_path / "nowhere"))

    def test_a_file_that_is_not_a_gguf_is_named(self, tmp_path):
        f = tmp_path / "model.bin"
        f.write_bytes(b"\0" * 64)
        with pytest.raises(factory.EngineBuildError, match=r"a file that is not a .gguf at .*model.bin"):
            LLM(f)

    def test_a_broken_gguf_is_one_clear_error(self, tmp_path):
        f = tmp_path / "some.gguf"
        f.write_bytes(b"GGUF")
        with pytest.raises(factory.EngineBuildError, match=r"cannot load the model at .*some.gguf: .*too short"):
            LLM(f)

    @pytest.mark.parametrize("command", [["generate", "hello"], ["bench", "--concurrency", "1"]])
    @pytest.mark.parametrize("model", ["/nonexistent", "some.gguf"])
    def test_every_command_prints_one_line_and_no_traceback(self, command, model, tmp_path):
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", *command, "--model", model],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        errors = [line for line in r.stderr.splitlines() if line.startswith(f"nvllm {command[0]}: ")]
        assert len(errors) == 1 and model in errors[0] and r.stderr.rstrip().endswith(errors[0])


class TestSizing:
    def test_one_rule_for_every_front_door(self, tiny):
        # LLM sizes its pool by the daemon's rule: the same reading gives the same pages.
        s = settings_for(tiny)
        info = factory.read_model_info(s)
        plan = factory.plan_pool(s, info, MemoryReading(8 * GiB, "test"))
        assert plan.sizing.num_blocks > 0 and plan.max_model_len == 256   # the tiny model's own limit
        llm = LLM(tiny)
        assert llm.engine.kv_cache.num_blocks == factory.plan_pool(
            s, info, factory.available_memory()).sizing.num_blocks

    def test_explicit_num_blocks_overrides_the_sizing(self, tiny):
        s = settings_for(tiny, cache={"num_blocks": 40})
        plan = factory.plan_pool(s, factory.read_model_info(s), MemoryReading(64 * GiB, "test"))
        assert plan.sizing.num_blocks == 40
        assert LLM(tiny, num_blocks=40).engine.kv_cache.num_blocks == 40

    def test_a_setting_of_the_wrong_type_is_refused_by_llm_too(self, tiny):
        with pytest.raises(ConfigError, match="cache.num_blocks"):
            LLM(tiny, num_blocks="abc")


class TestRequests:
    def test_chat_is_rendered_inside_the_engine(self, offline):
        messages = [{"role": "user", "content": "hi there"}]
        engine = offline.engine
        seq = engine.make_sequence("c", {"messages": messages}, SamplingParams(max_tokens=2))
        assert seq.token_ids == offline.tokenizer.encode_chat(messages)

    def test_a_bad_message_is_refused_naming_it(self, offline):
        with pytest.raises(InvalidParameter, match=r"^messages\[0\]") as e:
            offline.engine.make_sequence("c", {"messages": [{"role": 5, "content": "x"}]}, None)
        assert e.value.field == "messages"

    def test_an_unknown_prompt_shape_is_refused(self, offline):
        with pytest.raises(InvalidParameter, match="^prompt must be text, token ids"):
            offline.engine.make_sequence("c", {"text": "x"}, None)

    def test_logprobs_carry_the_tokens_spelling(self, offline):
        out = offline.generate("hello", SamplingParams(temperature=0, max_tokens=3, logprobs=2))[0]
        tok = offline.tokenizer
        assert all(t.token == (tok.id_to_token(t.token_id) or "") for lp in out.logprobs for t in lp.top)
        assert all(len(lp.top) == 2 for lp in out.logprobs)


class TestGGUF:
    def test_a_gguf_serves_like_its_folder(self, tiny_models, tiny_ggufs):
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        prompts = ["The quick brown fox", {"messages": [{"role": "user", "content": "hi"}]}]
        for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3"):
            folder = LLM(tiny_models[name], num_blocks=64).generate(prompts, params)
            gguf = LLM(tiny_ggufs[name], num_blocks=64).generate(prompts, params)
            assert [o.token_ids for o in gguf] == [o.token_ids for o in folder], name
            assert [o.text for o in gguf] == [o.text for o in folder], name

    def test_planning_from_a_gguf_reads_only_its_header(self, tiny_models, tiny_ggufs):
        info = factory.read_model_info(settings_for(tiny_ggufs["tiny-qwen2"]))   # written as float32
        folder = factory.read_model_info(load_settings(overrides={"model": {
            "path": str(tiny_models["tiny-qwen2"]), "quantization": "f32"}}))
        assert (info.architecture, info.num_params, info.weight_bytes, info.bytes_per_token) == \
            (folder.architecture, folder.num_params, folder.weight_bytes, folder.bytes_per_token)

    def test_the_eot_token_ends_a_reply(self, tiny_ggufs):
        loaded = factory.load_model(settings_for(tiny_ggufs["tiny-qwen2"]))
        assert loaded.tokenizer.extra_eos_ids <= loaded.eos_token_ids
        assert loaded.tokenizer.eos_token_id in loaded.eos_token_ids

    def test_serve_dry_run_plans_a_gguf_for_another_board(self, tiny_ggufs, tmp_path):
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny_ggufs["tiny-llama"]),
                            "--dry-run", "--memory-gb", "8"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert "LlamaForCausalLM" in r.stdout and "pool:" in r.stdout


class TestQuantizationAtLoad:
    @pytest.mark.parametrize("kind,fraction",
                             [("q8_0", 0.3), ("q4_0", 0.2), ("q4_k", 0.3), ("bf16", 0.55), ("f16", 0.55)])
    def test_a_folder_is_served_in_the_format_asked_for(self, tiny_models, kind, fraction):
        from nvllm.model.matrix.packed import PackedWeight

        full = LLM(tiny_models["tiny-qwen2"], num_blocks=64, quantization="f32")
        small = LLM(tiny_models["tiny-qwen2"], num_blocks=64, quantization=kind)
        w = small.engine.model.weights
        kept = PackedWeight   # every block format packed at load, the 16-bit floats among them
        assert all(isinstance(getattr(layer, f), kept) for layer in w.layers for f in ("qkv", "o", "gate_up", "down"))
        assert isinstance(w.embed, kept)
        assert w.nbytes < fraction * full.engine.model.weights.nbytes
        out = small.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert len(out[0].token_ids) == 8 and out[0].finish_reason == "length"

    def test_a_gguf_is_not_quantized_again(self, tiny_ggufs):
        with pytest.raises(factory.EngineBuildError, match="model.quantization='q8_0' is for Hugging Face folders"):
            LLM(tiny_ggufs["tiny-llama"], quantization="q8_0")

    def test_an_unknown_format_is_a_settings_error(self, tiny):
        with pytest.raises(ConfigError, match="model.quantization"):
            LLM(tiny, quantization="q3_k")
