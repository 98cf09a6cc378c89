"""The chat template: rendering messages as transformers renders them (the template's default system prompt,
multi-turn, text parts joined, encode_chat's special ids), malformed messages refused naming the field, and
the template's environment (raise_exception, the sandbox, tojson, strftime_now, loop controls, namespaces,
trim_blocks and lstrip_blocks, special tokens as variables), compiled once."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer as Backend  # noqa: E402
from tokenizers import models as tk_models  # noqa: E402

from helpers.tokenizer_cases import SYSTEM, USER  # noqa: E402
from nvllm.text.chat_template import validate_messages  # noqa: E402
from nvllm.text.tokenizer import Tokenizer  # noqa: E402


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
        ([{"role": "user", "content": [{"type": "text", "text": None}]}],
         "messages[0].content[0].text must be a string"),
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
    # pad_token None: not set (Tokenizer keeps only the names that are set, though it annotates values as str)
    return Tokenizer(Backend(tk_models.BPE()), chat_template=source,
                     special_tokens={"bos_token": "<s>", "eos_token": "</s>",
                                     "pad_token": None})  # type: ignore[dict-item]


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
