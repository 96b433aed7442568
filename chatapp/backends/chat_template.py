"""Render a model's Jinja chat template into prompt text, as transformers does.

Contract of ``render_chat``: the template (from a GGUF's ``tokenizer.chat_template`` or a
tokenizer config) is rendered in jinja2's ``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a ``raise_exception`` global, a
``strftime_now`` global, a ``tojson`` filter that does not escape HTML, and
``add_generation_prompt=True``, so the text ends where the assistant's reply begins. When there is
no template, or it fails to render (syntax error, ``raise_exception``, a runtime error in the
template), a plain ChatML template is used instead and the second value returned is ``True``.
Pure: no model, no I/O. Templates are untrusted code; the sandbox keeps them from escaping.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateMessage(Protocol):
    """What a template renders of a message (the chat layer's ``ChatMessage`` is one)."""

    @property
    def role(self) -> str: ...  # "system" | "user" | "assistant"

    @property
    def content(self) -> str: ...


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
                eos_token: str) -> tuple[str, bool]:
    """Return ``(prompt text ending with the assistant generation prompt, fallback used)``."""
    if template:
        try:
            return _render(template, messages, bos_token, eos_token), False
        except _RENDER_ERRORS:
            pass
    return _render(CHATML_TEMPLATE, messages, bos_token, eos_token), True


def _render(template: str, messages: Sequence[TemplateMessage], bos_token: str,
            eos_token: str) -> str:
    return _compile(template).render(
        messages=[{"role": m.role, "content": m.content} for m in messages],
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=True,
    )


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
