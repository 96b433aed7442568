"""Render a model's Jinja chat template into prompt text, as transformers does.

Contract of ``render_chat``: the template (from a GGUF's ``tokenizer.chat_template`` or a
tokenizer config) is rendered in jinja2's ``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a ``raise_exception`` global, a
``strftime_now`` global, a ``tojson`` filter that does not escape HTML, and
``add_generation_prompt=True``, so the text ends where the assistant's reply begins. When there is
no template, or it fails to render (syntax error, ``raise_exception``, a runtime error in the
template), a plain ChatML template is used instead and the second value returned is ``True``.
Pure: no model, no I/O. Templates are untrusted code; the sandbox keeps them from escaping.

Tools: ``tools`` (OpenAI's ``{"type": "function", "function": {...}}`` objects) go to the template
as its ``tools`` variable, a message's ``tool_calls`` (``id``, ``name``, ``arguments`` as JSON
text) as OpenAI's objects with the arguments parsed (as transformers' templates expect them), and
a ``tool`` message by its role. A template that shows no declared tool in its prompt (it has no
tools, or the fallback was used) raises ``RequestRefused``. ``tool_literals`` are the JSON texts
the template writes of tools and arguments: the prompt's assembly keeps them plain text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from chatapp.errors import RequestRefused

Tools = Sequence[Mapping[str, Any]]


class TemplateMessage(Protocol):
    """What a template renders of a message (the chat layer's ``ChatMessage`` is one)."""

    @property
    def role(self) -> str: ...  # "system" | "user" | "assistant"

    @property
    def content(self) -> str: ...


class TemplateToolCall(Protocol):
    """What a template renders of an assistant message's tool call (``tool_calls``, optional)."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> str: ...  # JSON text


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# What a template may raise while it renders; anything else is a bug here, not in the template.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError,
                  ArithmeticError)


def render_chat(template: str | None, messages: Sequence[TemplateMessage], bos_token: str,
                eos_token: str, tools: Tools = ()) -> tuple[str, bool]:
    """Return ``(prompt text ending with the assistant generation prompt, fallback used)``;
    ``RequestRefused`` when ``tools`` are given and the template shows none of them."""
    if template:
        try:
            text = _render(template, messages, bos_token, eos_token, tools)
        except _RENDER_ERRORS:
            pass
        else:
            return shows_tools(text, tools), False
    if tools:
        raise _no_tools()
    return _render(CHATML_TEMPLATE, messages, bos_token, eos_token, ()), True


def tool_literals(messages: Sequence[TemplateMessage], tools: Tools) -> list[str]:
    """The texts a template writes of ``tools`` and of the messages' tool calls: the JSON of
    each tool and of each call's arguments, and each call's id."""
    calls = [call for m in messages for call in getattr(m, "tool_calls", ())]
    return ([_tojson(tool) for tool in tools] + [_tojson(_arguments(c.arguments)) for c in calls]
            + [call.id for call in calls])


def shows_tools(text: str, tools: Tools) -> str:
    """``text``, a prompt rendered with ``tools``; ``RequestRefused`` if it shows none of them."""
    if tools and _tojson(tools[0]) not in text:
        raise _no_tools()
    return text


def _no_tools() -> RequestRefused:
    return RequestRefused("This model's chat template has no tools: it cannot be given tools "
                          "(send the request without them, or load a model that takes tools).")


def _render(template: str, messages: Sequence[TemplateMessage], bos_token: str,
            eos_token: str, tools: Tools) -> str:
    return _compile(template).render(
        messages=[template_message(m) for m in messages],
        tools=[dict(tool) for tool in tools] or None,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=True,
    )


def template_message(message: TemplateMessage) -> dict[str, Any]:
    """A message as transformers hands it to a template."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    calls: Sequence[TemplateToolCall] = getattr(message, "tool_calls", ())
    if calls:
        data["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
            for call in calls]
    return data


def _arguments(text: str) -> Any:
    """A call's JSON arguments as a value (the text itself when it is not JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON without HTML escaping (jinja2's own ``tojson`` escapes ``<`` and ``>``)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)
