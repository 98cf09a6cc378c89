"""One chat request as every front door reads it: OpenAI's chat completions, Anthropic's Messages, OpenAI's
Responses and gRPC's Generate each translate their own shapes into a ChatRequest, and `plan` makes the
engine's prompt and parameters from it the same way for all of them (so one conversation with one set of
tools gives the same prompt, constraint and tool calls through any of them).

The shapes inside are the engine's own, which are OpenAI chat's: messages with role, content, tool_calls
[{"id", "type": "function", "function": {"name", "arguments"}}] and tool_call_id; tools as
{"type": "function", "function": {"name", "description", "parameters"}}; tool_choice as "none", "auto",
"required" or {"type": "function", "function": {"name"}}. A FieldError from planning names the field in
that spelling; each front door renames it to its own (`rename`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvllm.engine.prompt import Prompt
from nvllm.sampling_params import SamplingParams
from nvllm.server.chat.field_error import bad_field
from nvllm.server.chat.response_format import Constraint
from nvllm.server.chat.tool_plan import ToolPlan, plan_tools

CONTEXT_OVERFLOW = ("error", "drop_oldest")


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    params: SamplingParams
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    constraint: Constraint | None = None          # the response format asked for (None: free text)
    template_kwargs: dict[str, Any] | None = None

    def plan(self, chat_template: str | None) -> PlannedChat:
        """The engine's prompt and parameters: the tools into the prompt, the one constraint the request
        asks for (a tool choice's or its response format's) onto the parameters. chat_template: the model's
        template text, which tells its tool-call format (tool_plan.py)."""
        prompt: dict[str, Any] = {"messages": self.messages}
        if self.template_kwargs is not None:
            prompt["chat_template_kwargs"] = self.template_kwargs
        constraint = self.constraint
        tool_plan = plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls, chat_template)
        if tool_plan is not None:
            prompt["tools"] = tool_plan.tools
            if tool_plan.constraint is not None:
                if constraint is not None:
                    field = constraint.param.split(".")[0]
                    raise bad_field(field, f"{field} cannot be combined with tool_choice {tool_plan.choice!r}, "
                                           f"which constrains the answer to tool calls")
                constraint = Constraint(tool_plan.constraint, "tools")
        if constraint is not None:
            self.params.structured = constraint.spec
        return PlannedChat(prompt, self.params, tool_plan, constraint.param if constraint is not None else None)


@dataclass
class PlannedChat:
    prompt: Prompt
    params: SamplingParams
    tool_plan: ToolPlan | None
    constraint_param: str | None      # the field the engine's constraint came from, for its refusals


def context_overflow(value: Any, field: str) -> str:
    """A request's context_overflow: "error" (refuse a prompt longer than the context, naming both lengths)
    or "drop_oldest" (drop whole turns from the oldest on, keeping the system prompt and the last turn)."""
    if value not in CONTEXT_OVERFLOW:
        raise bad_field(field, f"{field} must be 'error' or 'drop_oldest', got {str(value)[:48]!r}")
    return str(value)
