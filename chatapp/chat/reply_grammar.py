"""What a reply's text must match, when a request constrains it (a JSON response format, a forced
tool call).

A ``ReplyGrammar`` is a grammar in llguidance's Lark dialect: a JSON schema is embedded as
``%json { ... }``, so ``start: %json {"type": "object"}`` is "any JSON object". The reply
pipeline hands it to the engine, which masks the target's distribution with it at every
verified position; the emitted tokens then follow the target's law restricted to the grammar.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplyGrammar:
    """``lark``: the grammar the whole reply must match (it ends when the grammar accepts and
    the model ends its turn); ``purpose``: what asked for it, named in messages and logs
    ("response_format json_schema 'weather'", "tool_choice get_weather")."""

    lark: str
    purpose: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any], purpose: str) -> "ReplyGrammar":
        """The reply is one JSON value that ``schema`` validates (``{}``: any JSON value)."""
        return cls(f"start: %json {json.dumps(schema)}", purpose)
