"""A model's chat template: choosing it from the model folder, compiling it in a sandbox, rendering messages.

Rendering aims at the text transformers' apply_chat_template(messages, add_generation_prompt=True) gives;
every failure (bad messages, a template that does not compile or raises) is a ValueError. OpenAI tools go
to a template that reads `tools` as transformers passes them; a template that does not gets them described
in the system message (describe_tools), the one place that text is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]


def select_chat_template(folder: Path, config: dict) -> str | None:
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


def _environment() -> ImmutableSandboxedEnvironment:
    return ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders them in."""
    env = _environment()
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
                         special_tokens: Mapping[str, str], tools: Sequence[Any] | None = None,
                         takes_tools: bool = True, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The template's text for messages, with the named special tokens as variables (as transformers does).

    tools (OpenAI's list of {"type": "function", "function": {...}}) go to the template as `tools` when it
    takes them (takes_tools, see template_takes_tools); otherwise they are described in the system message
    (describe_tools) and earlier assistant tool calls are written into their content. template_kwargs
    (a request's chat_template_kwargs, e.g. {"enable_thinking": False}) are extra variables; one may not
    replace a variable of the render's own (validate_template_kwargs).
    """
    if not isinstance(add_generation_prompt, bool):
        raise ValueError("add_generation_prompt must be a bool")
    extra = validate_template_kwargs(template_kwargs, special_tokens)
    clean = validate_messages(messages)
    clean_tools = None if tools is None else validate_tools(tools)
    if not takes_tools:
        clean, clean_tools = _describe_in_messages(clean, clean_tools or []), None
    try:
        return template.render(
            messages=clean, tools=clean_tools or None, documents=None,
            add_generation_prompt=add_generation_prompt, **special_tokens, **extra,
        )
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template error: {e}") from e
    except (TypeError, KeyError, IndexError, AttributeError, ValueError, ArithmeticError) as e:
        raise ValueError(f"chat template error: {type(e).__name__}: {e}") from e


# The variables a render sets itself (and the environment's globals): chat_template_kwargs may not replace them.
RENDER_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                              "raise_exception", "strftime_now", "namespace"})


def validate_template_kwargs(kwargs: Any, special_tokens: Mapping[str, str]) -> dict[str, Any]:
    """A request's chat_template_kwargs as plain JSON values; ValueError starting "chat_template_kwargs"
    for one that is not an object of names, or that names a variable the render sets itself (the messages,
    the tools, add_generation_prompt, a special token such as bos_token)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"chat_template_kwargs must be an object, got {type(kwargs).__name__}")
    taken = RENDER_VARIABLES | set(special_tokens)
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"chat_template_kwargs keys must be template variable names, got {str(key)[:64]!r}")
        if key in taken or key.startswith("_"):
            raise ValueError(f"chat_template_kwargs.{key} would override the chat template's own variable "
                             f"{key!r}" if key in taken else
                             f"chat_template_kwargs.{key[:64]}: names may not start with '_'")
    try:
        return json.loads(json.dumps(dict(kwargs)))
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"chat_template_kwargs must be JSON: {e}") from None


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check chat messages and return plain {"role", "content"} dicts; text parts are joined with newlines.

    An assistant message may carry OpenAI's tool_calls (then its content may be null), kept with each
    call's arguments parsed from their JSON string into an object, as chat templates expect; a tool message
    keeps its tool_call_id and name. Raises ValueError naming the bad field, e.g. "messages[2].content must
    be a string".
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
        calls = message.get("tool_calls")
        if role == "assistant" and calls is not None:
            content = message.get("content")
            text = "" if content is None else _message_text(content, f"{where}.content")
            clean.append({"role": role, "content": text,
                          "tool_calls": _message_tool_calls(calls, f"{where}.tool_calls")})
            continue
        entry: dict[str, Any] = {"role": role, "content": _message_text(message.get("content"), f"{where}.content")}
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if message.get(key) is not None:
                    if not isinstance(message[key], str):
                        raise ValueError(f"{where}.{key} must be a string, got {type(message[key]).__name__}")
                    entry[key] = message[key]
        clean.append(entry)
    return clean


def _message_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, (list, tuple)):
        raise ValueError(f"{where} must be a list, got {type(calls).__name__}")
    clean = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise ValueError(f"{at} must be a dict like {{'type': 'function', 'function': {{'name', 'arguments'}}}}")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{at}.function.name must be a non-empty string")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass  # kept as the string it is; templates that tojson it show it quoted
        elif arguments is not None and not isinstance(arguments, Mapping):
            raise ValueError(f"{at}.function.arguments must be a JSON string, got {type(arguments).__name__}")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ValueError(f"{at}.id must be a string, got {type(call_id).__name__}")
        # Both spellings templates use: Qwen2.5's reads tool_call.function, others read name/arguments.
        fn = {"name": name, "arguments": {} if arguments is None else arguments}
        clean.append({"id": call_id, "type": "function", "function": fn, **fn})
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


# ------------------------------------------------------------------------------------------ tools


def template_takes_tools(source: str | None) -> bool:
    """Whether a chat template reads the `tools` variable (then tools go to it; else describe_tools)."""
    if not source:
        return False
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(_environment().parse(source))
    except jinja2.TemplateError:
        return False


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check OpenAI's tools list: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].

    Returns plain dicts; raises ValueError naming the field, e.g. "tools[1].function.name must be ...".
    """
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"tools must be a list of tools, got {type(tools).__name__}")
    clean = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ValueError(f"{where} must be a dict like {{'type': 'function', 'function': {{...}}}}")
        if tool.get("type", "function") != "function":
            raise ValueError(f"{where}.type must be 'function', got {tool.get('type')!r}")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ValueError(f"{where}.function must be a dict with a 'name', got {type(function).__name__}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.function.name must be a non-empty string")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ValueError(f"{where}.function.description must be a string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ValueError(f"{where}.function.parameters must be a JSON schema object")
        try:
            # The tool as given (templates print it with tojson, as transformers passes it), as plain JSON.
            clean.append(json.loads(json.dumps({"type": "function", **tool})))
        except (TypeError, ValueError, RecursionError) as e:
            raise ValueError(f"{where} must be JSON: {e}") from None
    return clean


# For templates that do not take tools, this text goes into the system message (after the system
# message's own text, or as a new first system message). It asks for the bare JSON call that the server
# constrains a forced tool choice to: {"name": ..., "arguments": {...}} (or a list of them).
TOOLS_PREAMBLE = "You can call the following functions. Each is described by a JSON object:"
TOOLS_CALL_FORMAT = ('To call a function, reply with only a JSON object {"name": <function name>, '
                     '"arguments": <the arguments as a JSON object>}, or a JSON list of such objects '
                     'to call several.')


def describe_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-message text describing tools to a model whose template does not take them."""
    lines = [TOOLS_PREAMBLE]
    lines += [json.dumps(tool["function"], ensure_ascii=False) for tool in tools]
    lines.append(TOOLS_CALL_FORMAT)
    return "\n".join(lines)


def _describe_in_messages(messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """messages with past calls written as their JSON text (with or without tools in this request) and the
    tools, if any, described in the system message."""
    out = []
    for m in messages:
        if "tool_calls" in m:
            calls = [{"name": c["name"], "arguments": c["arguments"]} for c in m["tool_calls"]]
            text = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
            m = {"role": m["role"], "content": f"{m['content']}\n{text}" if m["content"] else text}
        out.append(m)
    if not tools:
        return out
    description = describe_tools(tools)
    if out and out[0]["role"] == "system":
        first = out[0]["content"]
        out[0] = {**out[0], "content": f"{first}\n\n{description}" if first else description}
    else:
        out.insert(0, {"role": "system", "content": description})
    return out
