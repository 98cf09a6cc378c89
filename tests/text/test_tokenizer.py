"""Tokenizer: loading a model folder (special tokens, optional and broken files, the chat template's sources)
and encode/decode (byte-level round trips, BOS as the post-processor decides, special tokens). The chat
template is in test_chat_template.py, streaming detokenization in test_detokenizer.py, SmolLM2's tokenizer in
test_tokenizer_smollm2.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nvllm.text.tokenizer import Tokenizer


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data), encoding="utf-8")


# ------------------------------------------------------------------------------------------- loading


class TestFromDir:
    def test_reads_special_tokens_and_eos_of_tiny_llama(self, llama):
        assert llama.vocab_size == 512
        assert llama.bos_token == "<|im_start|>" and llama.bos_token_id == 1
        assert llama.eos_token == "<|im_end|>" and llama.eos_token_id == 2
        assert llama.all_special_ids == {0, 1, 2}
        assert llama.pad_token_id == 0

    def test_eos_token_comes_from_tokenizer_config(self, qwen, tiny_models, tmp_path):
        assert qwen.eos_token_id == 2 and qwen.bos_token_id is None
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        edit_json(folder / "tokenizer_config.json", eos_token={"content": "<|endoftext|>", "special": True})
        tok = Tokenizer.from_dir(folder)
        assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0

    def test_missing_optional_files_are_fine(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        for name in ("generation_config.json", "config.json", "tokenizer_config.json"):
            (folder / name).unlink()
        tok = Tokenizer.from_dir(folder)
        assert tok.eos_token_id is None and tok.bos_token_id is None
        assert tok.encode("Hello") == Tokenizer.from_dir(tiny_models["tiny-llama"]).encode("Hello")
        with pytest.raises(ValueError, match="no chat template"):
            tok.render_chat([{"role": "user", "content": "hi"}])

    def test_missing_tokenizer_json_names_the_file(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        (folder / "tokenizer.json").unlink()
        with pytest.raises(FileNotFoundError, match="tokenizer.json"):
            Tokenizer.from_dir(folder)

    def test_missing_folder_names_the_folder(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="nowhere"):
            Tokenizer.from_dir(tmp_path / "nowhere")

    def test_broken_json_names_the_file(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        (folder / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
        with pytest.raises(ValueError, match="tokenizer_config.json"):
            Tokenizer.from_dir(folder)

    def test_chat_template_list_takes_default(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        edit_json(folder / "tokenizer_config.json", chat_template=[
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT {{ messages[0]['content'] }}"},
        ])
        assert Tokenizer.from_dir(folder).render_chat([{"role": "user", "content": "x"}]) == "DEFAULT x"

    def test_chat_template_list_without_default_names_the_file(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        edit_json(folder / "tokenizer_config.json", chat_template=[{"name": "tool_use", "template": "T"}])
        with pytest.raises(ValueError, match="tokenizer_config.json.*default"):
            Tokenizer.from_dir(folder)

    def test_chat_template_jinja_file_wins(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        (folder / "chat_template.jinja").write_text("FILE{{ bos_token }}", encoding="utf-8")
        assert Tokenizer.from_dir(folder).render_chat([{"role": "user", "content": "x"}]) == "FILE<|im_start|>"

    def test_template_that_does_not_compile_fails_at_load(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        edit_json(folder / "tokenizer_config.json", chat_template="{% for m in messages %}")
        with pytest.raises(ValueError, match="does not compile"):
            Tokenizer.from_dir(folder)

    def test_add_bos_token_flag_adds_bos(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        edit_json(folder / "tokenizer_config.json", add_bos_token=True)
        tok = Tokenizer.from_dir(folder)
        ids = tok.encode("Hello")
        assert ids[0] == 1 and ids[1:] == tok.encode("Hello", add_special_tokens=False)
        # the chat template writes its own special tokens: no second BOS
        assert tok.encode_chat([{"role": "user", "content": "hi"}])[:2] != [1, 1]

    def test_declared_special_token_missing_from_tokenizer_json_is_added(self, tiny_models, tmp_path):
        folder = copy_model(tiny_models["tiny-llama"], tmp_path / "m")
        edit_json(folder / "tokenizer_config.json", additional_special_tokens=["<|tool|>"])
        tok = Tokenizer.from_dir(folder)
        assert tok.vocab_size == 513
        tool = tok.token_to_id("<|tool|>")
        assert tool is not None
        assert tok.encode("a<|tool|>b").count(tool) == 1
        assert tool in tok.all_special_ids


# ---------------------------------------------------------------------------------- encode / decode


TEXTS = [
    "Hello, world!",
    "12345 and 3.14159",
    "def f(x):\n    return x * 2\n\n\tindented = True\n",
    "Größe 東京 Здравствуйте",
    "emoji 🚀 👍🏽 👨‍👩‍👧",
    "  leading and trailing  ",
    " ",
    "",
]


class TestEncodeDecode:
    @pytest.mark.parametrize("text", TEXTS)
    def test_byte_level_round_trip(self, llama, text):
        assert llama.decode(llama.encode(text)) == text

    def test_tiny_tokenizer_adds_no_bos(self, llama):
        assert llama.encode("Hello") == llama.encode("Hello", add_special_tokens=False)

    def test_post_processor_decides_about_bos(self, sp):
        assert sp.encode("Hello")[0] == sp.bos_token_id
        assert sp.encode("Hello")[1:] == sp.encode("Hello", add_special_tokens=False)

    def test_special_token_text_becomes_the_special_id(self, llama):
        ids = llama.encode("before<|im_end|>after")
        assert 2 in ids
        assert llama.decode(ids) == "beforeafter"
        assert llama.decode(ids, skip_special_tokens=False) == "before<|im_end|>after"

    def test_decode_drops_unknown_ids(self, llama):
        ids = llama.encode("Hello")
        assert llama.decode(ids + [10**6]) == "Hello"

    def test_id_to_token(self, llama):
        assert llama.id_to_token(2) == "<|im_end|>"
        assert llama.id_to_token(10**6) is None

