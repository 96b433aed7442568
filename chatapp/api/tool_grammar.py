"""The grammar that forces a reply to be tool calls, for ``tool_choice`` "required" or a named
function.

The reply must be ``<tool_call>\\n{"name": "<fn>", "arguments": <args>}\\n</tool_call>``, the form
the Qwen2.5 (Hermes-style) chat templates teach, with ``<fn>`` one of the forced functions and
``<args>`` JSON matching that function's ``parameters`` schema (llguidance's ``%json``
embedding); with parallel calls allowed, one or more such calls, a newline apart. The tags are
string literals, so they match the model's added ``<tool_call>`` tokens and the same text
spelled in pieces alike.
"""

from __future__ import annotations

import json

from chatapp.chat.reply_grammar import ReplyGrammar
from chatapp.chat.tools import Tools


def tool_call_grammar(tools: Tools) -> ReplyGrammar | None:
    """The grammar of a reply that calls one of ``tools.forced``; None when no call is forced."""
    forced = tools.forced
    if not forced:
        return None
    calls = " | ".join(f"call_{i}" for i in range(len(forced)))
    start = 'start: tool_call ("\\n" tool_call)*' if tools.parallel else "start: tool_call"
    lines = [start, f'tool_call: "<tool_call>\\n" ({calls}) "\\n</tool_call>"']
    for i, tool in enumerate(forced):
        header = json.dumps(f'{{"name": {json.dumps(tool.name)}, "arguments": ')
        lines.append(f'call_{i}: {header} args_{i} "}}"')
        lines.append(f"args_{i}: %json {tool.parameters_json}")
    purpose = "tool_choice " + ("required" if len(forced) > 1 else forced[0].name)
    return ReplyGrammar("\n".join(lines) + "\n", purpose)
