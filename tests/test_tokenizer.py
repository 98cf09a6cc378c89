"""Tokenizer: loading a model folder, encode/decode, chat templates, streaming detokenization."""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer as Backend  # noqa: E402
from tokenizers import models as tk_models  # noqa: E402
from tokenizers import normalizers, trainers  # noqa: E402

from nvllm.text.chat_template import validate_messages  # noqa: E402
from nvllm.text.detokenizer import IncrementalDetokenizer  # noqa: E402
from nvllm.text.tokenizer import Tokenizer  # noqa: E402

FFFD = "\ufffd"
# NVLLM_HYPOTHESIS_EXAMPLES=5000 for a deeper search than the default run.
PROPERTY = settings(
    max_examples=int(os.environ.get("NVLLM_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def llama(tiny_models) -> Tokenizer:
    return Tokenizer.from_dir(tiny_models["tiny-llama"])


@pytest.fixture(scope="module")
def qwen(tiny_models) -> Tokenizer:
    return Tokenizer.from_dir(tiny_models["tiny-qwen2"])


SP_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today?",
    "def add(a, b):\n    return a + b\n",
    "Die Größe des Hauses ist schön.",
    "The answer is 42.",
]


def build_sentencepiece_style() -> Tokenizer:
    """A Llama-2-style tokenizer: Metaspace normalizer, BPE with byte fallback, a decoder that strips the
    leading space, BOS added by the post-processor. The tiny test models are byte-level; this covers the
    other family of decoders."""
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    base = Backend(tk_models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.train_from_iterator(SP_CORPUS * 3, trainer)
    spec = json.loads(base.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):  # byte tokens sit in the model vocabulary, as in Llama 2
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    spec["model"]["vocab"] = vocab
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ]}
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return Tokenizer(Backend.from_str(json.dumps(spec)),
                     special_tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})


@pytest.fixture(scope="module")
def sp() -> Tokenizer:
    return build_sentencepiece_style()


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


def stream(tok: Tokenizer, prompt: Sequence[int], output: Sequence[int], skip: bool = True) -> tuple[list[str], str]:
    """Every add() result, and the flush() at the end."""
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    deltas = [detok.add(t) for t in output]
    tail = detok.flush()
    assert detok.text == "".join(deltas) + tail
    return deltas, tail


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


# ---------------------------------------------------------------------------------------------- chat


SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi!"}


class TestChat:
    def test_without_system_message_uses_the_template_default(self, llama):
        assert llama.render_chat([USER]) == (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        )

    def test_with_system_message(self, llama):
        assert llama.render_chat([SYSTEM, USER]) == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        )

    def test_multi_turn_without_generation_prompt(self, llama):
        turns = [SYSTEM, USER, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
        assert llama.render_chat(turns, add_generation_prompt=False) == (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        )

    def test_encode_chat_encodes_the_rendered_text_without_adding_special_tokens(self, llama, sp):
        ids = llama.encode_chat([SYSTEM, USER])
        assert ids == llama.encode(llama.render_chat([SYSTEM, USER]), add_special_tokens=False)
        assert ids[0] == 1 and ids[-1] != 2
        assert ids.count(1) == 3  # three <|im_start|>: the special tokens the template wrote are special ids

    def test_text_parts_are_joined(self, llama):
        parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        assert llama.render_chat([parts]) == llama.render_chat([{"role": "user", "content": "a\nb"}])

    def test_extra_message_keys_are_not_passed(self, llama):
        assert validate_messages([{"role": "user", "content": "x", "name": "n"}]) == [{"role": "user", "content": "x"}]

    @pytest.mark.parametrize("messages, field", [
        ("hi", "messages must be a list"),
        ([], "messages must not be empty"),
        ([USER, "hello"], "messages[1] must be a dict"),
        ([{"content": "x"}], "messages[0].role must be a string"),
        ([{"role": "", "content": "x"}], "messages[0].role must not be empty"),
        ([USER, USER, {"role": "user", "content": 3}], "messages[2].content must be a string"),
        ([{"role": "user"}], "messages[0].content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}], "messages[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "text", "text": None}]}], "messages[0].content[0].text must be a string"),
        ([{"role": "user", "content": ["plain"]}], "messages[0].content[0] must be a dict"),
    ])
    def test_bad_messages_are_rejected_naming_the_field(self, llama, messages, field):
        with pytest.raises(ValueError) as info:
            llama.render_chat(messages)
        assert field in str(info.value)

    def test_add_generation_prompt_must_be_bool(self, llama):
        with pytest.raises(ValueError, match="add_generation_prompt"):
            llama.render_chat([USER], add_generation_prompt="yes")


def templated(source: str) -> Tokenizer:
    return Tokenizer(Backend(tk_models.BPE()), chat_template=source,
                     special_tokens={"bos_token": "<s>", "eos_token": "</s>", "pad_token": None})


class TestTemplateEnvironment:
    def test_raise_exception_becomes_value_error(self):
        tok = templated(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
        )
        with pytest.raises(ValueError, match="first must be user"):
            tok.render_chat([SYSTEM])

    def test_runtime_errors_become_value_error(self):
        with pytest.raises(ValueError, match="chat template error"):
            templated("{{ messages[5]['content'] + 1 }}").render_chat([USER])

    def test_sandbox_refuses_internals(self):
        with pytest.raises(ValueError, match="chat template error"):
            templated("{{ messages.__class__.__mro__ }}").render_chat([USER])
        with pytest.raises(ValueError, match="chat template error"):
            templated("{% set ns = namespace(_x=1) %}").render_chat([USER])

    def test_tojson_keeps_non_ascii(self):
        assert templated("{{ messages[0] | tojson }}").render_chat([{"role": "user", "content": "é<>"}]) == (
            '{"role": "user", "content": "é<>"}'
        )

    def test_tojson_options(self):
        out = templated("{{ {'b': 1, 'a': 2} | tojson(indent=2, sort_keys=True) }}").render_chat([USER])
        assert out == '{\n  "a": 2,\n  "b": 1\n}'

    def test_strftime_now_loopcontrols_namespace_generation(self):
        src = (
            "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
            "{% set ns.n = ns.n + 1 %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
            "|{{ ns.n }}|{{ strftime_now('%Y') | length }}"
        )
        assert templated(src).render_chat([USER, USER]) == "Hi!|1|4"

    def test_trim_blocks_and_lstrip_blocks(self):
        src = "{% for m in messages %}\n    {% if true %}\n[{{ m['content'] }}]\n    {% endif %}\n{% endfor %}\n"
        assert templated(src).render_chat([USER, USER]) == "[Hi!]\n[Hi!]\n"

    def test_special_tokens_and_flags_are_variables(self):
        src = ("{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ tools is none }}"
               "|{{ add_generation_prompt }}")
        assert templated(src).render_chat([USER], add_generation_prompt=False) == "<s>|</s>|False|True|False"

    def test_template_is_compiled_once(self, llama, monkeypatch):
        import nvllm.text.chat_template as module

        def fail(source):
            raise AssertionError("recompiled")
        monkeypatch.setattr(module, "compile_chat_template", fail)
        assert llama.render_chat([USER]) == llama.render_chat([USER])


# --------------------------------------------------------------------------- incremental detokenizer


def ids_strategy(vocab_size: int, max_size: int = 40):
    # Mostly real ids, some unknown ones past the vocabulary (a padded lm_head can produce them).
    return st.lists(st.integers(0, vocab_size + 3), max_size=max_size)


class TestIncrementalDetokenizerByteLevel:
    @PROPERTY
    @given(prompt=ids_strategy(512, 12), output=ids_strategy(512), skip=st.booleans())
    def test_deltas_concatenate_to_the_full_decode(self, llama, prompt, output, skip):
        deltas, tail = stream(llama, prompt, output, skip)
        assert "".join(deltas) + tail == llama.decode(output, skip_special_tokens=skip)

    @PROPERTY
    @given(prompt=ids_strategy(512, 12), output=ids_strategy(512), skip=st.booleans())
    def test_no_replacement_char_unless_the_decode_has_one_then(self, llama, prompt, output, skip):
        deltas, _ = stream(llama, prompt, output, skip)
        for n, delta in enumerate(deltas, start=1):
            if FFFD in delta:
                assert FFFD in llama.decode(output[:n], skip_special_tokens=skip)

    @PROPERTY
    @given(prompt=st.text(max_size=20), text=st.text(max_size=40))
    def test_streaming_encoded_text_gives_the_text_back(self, qwen, prompt, text):
        output = qwen.encode(text)
        # Qwen2's tokenizer normalises to NFC, so the text that comes back is the NFC form.
        text = unicodedata.normalize("NFC", text)
        deltas, tail = stream(qwen, qwen.encode(prompt), output)
        if not text.endswith(FFFD):  # a literal U+FFFD at the end looks incomplete and waits for flush()
            assert tail == ""  # complete text leaves nothing held
        assert "".join(deltas) + tail == text
        assert all(FFFD not in d for d in deltas) or FFFD in text

    def test_first_output_token_keeps_its_leading_space(self, llama):
        prompt = llama.encode_chat([USER])
        deltas, _ = stream(llama, prompt, llama.encode(" Paris is nice"))
        assert "".join(deltas) == " Paris is nice"

    def test_incomplete_character_is_held_then_completed(self, llama):
        ids = llama.encode("€")  # three bytes; the tiny vocabulary has no merge for them
        assert len(ids) >= 2
        detok = IncrementalDetokenizer(llama, [])
        assert [detok.add(t) for t in ids[:-1]] == [""] * (len(ids) - 1)
        assert detok.add(ids[-1]) == "€"

    def test_flush_returns_an_incomplete_character_at_the_end(self, llama):
        ids = llama.encode("€")[:-1]
        deltas, tail = stream(llama, [], ids)
        assert deltas == [""] * len(ids)
        assert tail == llama.decode(ids) == FFFD

    def test_special_tokens_skipped_or_kept(self, llama):
        output = llama.encode("Hi") + [2]
        assert "".join(stream(llama, [], output, skip=True)[0]) == "Hi"
        assert "".join(stream(llama, [], output, skip=False)[0]) == "Hi<|im_end|>"

    def test_cost_per_token_does_not_grow_with_output_length(self, llama):
        detok = IncrementalDetokenizer(llama, llama.encode("Once upon a time"))
        longest = []
        real = detok._decode

        def spy(ids, **kwargs):
            longest.append(len(ids))
            return real(ids, **kwargs)
        detok._decode = spy
        text = "The quick brown fox jumps over the lazy dog. " * 40
        ids = llama.encode(text)
        out = "".join(detok.add(t) for t in ids)
        assert out == text and len(ids) > 300
        assert max(longest) <= 8


class TestIncrementalDetokenizerSentencePiece:
    @PROPERTY
    @given(output=ids_strategy(376), skip=st.booleans())
    def test_without_prompt_deltas_concatenate_to_the_full_decode(self, sp, output, skip):
        deltas, tail = stream(sp, [], output, skip)
        assert "".join(deltas) + tail == sp.decode(output, skip_special_tokens=skip)

    @PROPERTY
    @given(prompt=ids_strategy(376, 12), output=ids_strategy(376), skip=st.booleans())
    def test_with_prompt_only_the_leading_space_may_differ(self, sp, prompt, output, skip):
        deltas, tail = stream(sp, prompt, output, skip)
        full = sp.decode(output, skip_special_tokens=skip)
        # decode() strips the first token's leading space; the stream keeps it after a prompt.
        assert "".join(deltas) + tail in (full, " " + full)

    @PROPERTY
    @given(prompt=ids_strategy(376, 12), output=ids_strategy(376), skip=st.booleans())
    def test_no_replacement_char_unless_the_decode_has_one_then(self, sp, prompt, output, skip):
        deltas, _ = stream(sp, prompt, output, skip)
        for n, delta in enumerate(deltas, start=1):
            if FFFD in delta:
                assert FFFD in sp.decode(output[:n], skip_special_tokens=skip)

    @PROPERTY
    @given(text=st.text(min_size=1, max_size=40), cut=st.integers(0, 40))
    def test_prompt_text_plus_stream_is_the_whole_text(self, sp, text, cut):
        ids = sp.encode(text)
        cut = min(cut, len(ids))
        prompt, output = ids[:cut], ids[cut:]
        head, whole = sp.decode(prompt), sp.decode(ids)
        assume(whole.startswith(head) and not head.endswith(FFFD) and (not prompt or prompt[-1] > 258))
        deltas, tail = stream(sp, prompt, output)
        assert head + "".join(deltas) + tail == whole

    def test_leading_space_of_first_output_token_is_kept(self, sp):
        ids = sp.encode("The quick brown fox")
        words = [sp.id_to_token(i) for i in ids]
        cut = next(i for i, w in enumerate(words) if i > 1 and w.startswith("▁"))
        deltas, _ = stream(sp, ids[:cut], ids[cut:])
        assert "".join(deltas).startswith(" ")
        assert sp.decode(ids[:cut]) + "".join(deltas) == "The quick brown fox"

    def test_a_later_byte_that_spoils_the_run_is_not_streamed_early(self, sp):
        c3, a9, word = 3 + 0xC3, 3 + 0xA9, sp.token_to_id("x▁")
        output = [c3, a9, a9, word]
        deltas, tail = stream(sp, [], output)
        assert sp.decode(output).startswith(FFFD * 3)  # the third byte spoils the whole run
        assert "".join(deltas) + tail == sp.decode(output)
        assert deltas[:3] == ["", "", ""]

    def test_long_valid_byte_run_streams_before_it_ends(self, sp):
        text = "東京" * 20  # no CJK in the vocabulary: 120 byte tokens in one run
        ids = sp.encode(text, add_special_tokens=False)[1:]  # after the "▁" the normalizer prepends
        assert len(ids) == 120 and set(ids) <= sp.byte_token_ids()
        deltas, tail = stream(sp, [], ids)
        assert "".join(deltas) + tail == text
        assert sum(1 for d in deltas if d) >= 3  # bounded latency: it did not wait for the run to end
        assert all(FFFD not in d for d in deltas)


# ---------------------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smol(smollm2) -> Tokenizer:
    # conftest's smollm2 fixture skips (or fails in CI) when the default model is not pulled
    return Tokenizer.from_dir(smollm2)


@pytest.mark.smollm2
class TestSmolLM2:
    def test_special_ids(self, smol):
        assert smol.eos_token == "<|im_end|>"
        assert smol.token_to_id("<|im_end|>") == smol.eos_token_id
        assert smol.vocab_size == 49152

    def test_chat_default_system_prompt(self, smol):
        text = smol.render_chat([USER])
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        ids = smol.encode_chat([USER])
        assert ids[0] == smol.token_to_id("<|im_start|>")

    @PROPERTY
    @given(prompt=st.text(max_size=20), text=st.text(max_size=60))
    def test_streaming_gives_the_text_back(self, smol, prompt, text):
        output = smol.encode(text)
        deltas, tail = stream(smol, smol.encode_chat([{"role": "user", "content": prompt}]), output)
        # (text with bytes SmolLM2's vocabulary lacks does not round-trip; the stream still equals decode)
        assert "".join(deltas) + tail == smol.decode(output)

    @PROPERTY
    @given(output=st.lists(st.integers(0, 49151), max_size=30), skip=st.booleans())
    def test_random_ids_stream_to_the_full_decode(self, smol, output, skip):
        deltas, tail = stream(smol, smol.encode("Hello"), output, skip)
        assert "".join(deltas) + tail == smol.decode(output, skip_special_tokens=skip)
