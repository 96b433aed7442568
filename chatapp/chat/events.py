"""What a conversation streams to its front ends, in one place: the engine's events and statistics
(token, step, prompt, done; a turn's and a replay's figures) and the chat's own plan event.

Front ends (the TUI, the web app, ``specchat run``, the API server) import these from here, never
from the engine: the import contracts in pyproject.toml hold them to it.
"""

from chatapp.chat.turns import PlanEvent
from chatapp.engine.events import (
    DoneEvent,
    Event,
    FinishReason,
    PromptEvent,
    PromptProgressEvent,
    StepEvent,
    TokenEvent,
    TokenSource,
)
from chatapp.engine.stats import (
    ReplayStats,
    TurnStats,
    decode_tokens_per_s,
    format_summary,
    is_target_only,
)

__all__ = ["DoneEvent", "Event", "FinishReason", "PlanEvent", "PromptEvent",
           "PromptProgressEvent", "ReplayStats", "StepEvent", "TokenEvent", "TokenSource",
           "TurnStats", "decode_tokens_per_s", "format_summary", "is_target_only"]
