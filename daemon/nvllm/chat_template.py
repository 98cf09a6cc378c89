"""A model's chat template: choosing it from the model folder, compiling it in a sandbox, rendering messages.

Rendering aims at the text transformers' apply_chat_template(messages, add_generation_prompt=True) gives;
every failure (bad messages, a template that does not compile or raises) is a ValueError.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]


def select_chat_template(folder: Path, config: dict) -> Optional[str]:
    """The template source of a model folder given its tokenizer_config.json; None when it has none."""
    # Like transformers: chat_template.jinja beside tokenizer_config.json wins over the config's entry.
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ValueError(
            f"{folder / 'tokenizer_config.json'}: chat_template lists templates {sorted(map(str, named))} "
            "but none named 'default'"
        )
    raise ValueError(f"{folder / 'tokenizer_config.json'}: chat_template must be a string or a list")


# ------------------------------------------------------------------------------------------ compiling


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (used by some templates for assistant masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore names so templates cannot reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (same trick as jinja's Namespace)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders them in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def load_chat_template(source: str, where: str) -> jinja2.Template:
    """compile_chat_template, with a template that does not compile reported as a ValueError naming where."""
    try:
        return compile_chat_template(source)
    except jinja2.TemplateError as e:
        raise ValueError(f"{where}: chat template does not compile: {e}") from e


# ------------------------------------------------------------------------------------------ rendering


def render_chat_template(template: jinja2.Template, messages: Sequence[Message], add_generation_prompt: bool,
                         special_tokens: Mapping[str, str]) -> str:
    """The template's text for messages, with the named special tokens as variables (as transformers does)."""
    if not isinstance(add_generation_prompt, bool):
        raise ValueError("add_generation_prompt must be a bool")
    clean = validate_messages(messages)
    try:
        return template.render(
            messages=clean, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
            **special_tokens,
        )
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template error: {e}") from e
    except (TypeError, KeyError, IndexError, AttributeError, ValueError, ArithmeticError) as e:
        raise ValueError(f"chat template error: {type(e).__name__}: {e}") from e


def validate_messages(messages: Any) -> List[Dict[str, str]]:
    """Check chat messages and return plain {"role", "content"} dicts; text parts are joined with newlines.

    Raises ValueError naming the bad field, e.g. "messages[2].content must be a string".
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must not be empty")
    clean = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError(f"{where}.role must be a string, got {type(role).__name__}")
        if not role:
            raise ValueError(f"{where}.role must not be empty")
        clean.append({"role": role, "content": _message_text(message.get("content"), f"{where}.content")})
    return clean


def _message_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where} must be a string (or a list of text parts), got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise ValueError(f"{where}[{j}] must be a dict like {{'type': 'text', 'text': ...}}")
        if part.get("type") != "text":
            raise ValueError(f"{where}[{j}].type must be 'text', got {part.get('type')!r}")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{j}].text must be a string, got {type(part.get('text')).__name__}")
        texts.append(part["text"])
    # vLLM joins text parts the same way when a template wants string content.
    return "\n".join(texts)
