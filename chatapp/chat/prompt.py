"""The prompt of a reply: its messages through the target's chat template, and what is done when
they and the room kept for the reply outgrow the context window.

What differs between a chat and an API request is a ``PromptRules`` value handed to
``ChatSession.reply``, never a second reply path:

- ``TRIM_OLDEST`` (the chat app, ``specchat run``): the configured system prompt replaces the
  messages' own and comes first; when the prompt and the reply's room outgrow the window, the
  oldest turns leave (never the system prompt, never the newest user message) and
  ``PromptPlan.dropped_messages`` says how many, so the front end shows the marker
  (``chatapp.chat.context.view_start_note``); ``ContextOverflowError`` when even the newest
  message alone does not fit.
- ``REFUSE_TOO_LONG`` (the API): the request's messages as sent, the configured system prompt
  first only when they have none; never trimmed: ``PromptTooLongError`` (the server's
  ``context_length_exceeded``) when no reply fits.
- ``RawText(prompt, suffix)`` (the API's completions): no messages and no chat template, the
  prompt as plain text; with a suffix, the model's fill-in-the-middle prompt (prefix, suffix,
  middle tokens around the two texts: the reply is what goes between), ``FimUnsupportedError``
  for a model without those tokens; refused as the API's messages are when too long. A prompt
  without a suffix that a client already wrote in the model's fill-in-the-middle form
  (``client_fim``: what editors send to OpenAI-compatible servers) is that prompt with its
  three spellings as the three tokens; any other control-token text stays text.

The room kept for the reply is one rule for both (``reply_room``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from chatapp.chat.message import ChatMessage
from chatapp.engine.loop import ContextOverflowError
from chatapp.errors import UserFacingError
from chatapp.text_budget import PromptOverLimit

# The room kept for a reply is at least this many tokens (unless its max_tokens is smaller).
MIN_REPLY_ROOM = 64

# messages -> prompt tokens through the template; with a limit, ``PromptOverLimit`` as soon as the
# prompt is known to pass it (``chatapp.text_budget``: the work stops there)
Render = Callable[[Sequence[ChatMessage], int | None], list[int]]


class PromptRender(Protocol):
    """What a reply's prompt is rendered with: the target's chat template (a ``Render``), and
    for the rules that use no template, its plain text and its fill-in-the-middle tokens."""

    def __call__(self, messages: Sequence[ChatMessage], limit: int | None = None) -> list[int]:
        ...

    def text(self, text: str, limit: int | None = None) -> list[int]:
        """``text``'s tokens as plain text (no control token); ``PromptOverLimit`` as soon as
        they pass ``limit``."""
        ...

    @property
    def fim(self) -> tuple[int, int, int] | None:
        """The target's fill-in-the-middle tokens (prefix, suffix, middle), None: it has none."""
        ...

    @property
    def fim_spellings(self) -> tuple[str, str, str] | None:
        """How ``fim``'s three tokens are written as text (``<|fim_prefix|>``, ...), None: the
        target has no fill-in-the-middle tokens."""
        ...

    @property
    def name(self) -> str:
        """The target's name, for refusals."""
        ...


def reply_room(max_tokens: int, n_ctx: int) -> int:
    """The tokens of an ``n_ctx`` window kept free for a reply of at most ``max_tokens`` when its
    prompt is planned: ``max_tokens``, but no more than a quarter of the window, and no less
    than ``MIN_REPLY_ROOM`` unless ``max_tokens`` is less. The reply itself may still run on to
    ``max_tokens`` or the end of the window, whichever comes first."""
    return min(max_tokens, max(MIN_REPLY_ROOM, n_ctx // 4))


@dataclass(frozen=True)
class PromptPlan:
    """A reply's prompt: its ``tokens``, the ``dropped_messages`` oldest messages left out,
    whether the target had no usable chat template (``fallback_template``: ChatML was used), and
    ``note``: what to tell the user about it once, else ""."""

    tokens: list[int]
    dropped_messages: int = 0
    fallback_template: bool = False
    note: str = ""


class PromptTooLongError(UserFacingError):
    """The request's messages (or raw prompt) leave no room for a reply in the context window."""

    def __init__(self, prompt_tokens: int, n_ctx: int, room: int, at_least: bool = False,
                 what: str = "messages are") -> None:
        """``at_least``: the work stopped once ``prompt_tokens`` passed the limit; ``what``:
        what was sent ("messages are": with the chat template)."""
        template = " with the chat template" if what == "messages are" else ""
        super().__init__(
            f"The {what} {'more than ' if at_least else ''}{prompt_tokens} tokens{template}, "
            f"and the context window holds {n_ctx} with at least {room} kept for the reply. "
            "Send less, or start the server with a larger --n-ctx.")
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class FimUnsupportedError(UserFacingError):
    """A fill-in-the-middle request to a model without fill-in-the-middle tokens."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"{model} has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
            "<|fim_middle|> in its vocabulary), so it cannot complete between a prompt and a "
            "suffix. Send the prompt without a suffix, or serve a model trained for it "
            "(qwen2.5-coder).")
        self.model = model


class PromptRules(Protocol):
    """How a reply's messages become its prompt (see the module docstring)."""

    def plan(self, render: PromptRender, system_prompt: str, messages: Sequence[ChatMessage],
             n_ctx: int, room: int) -> PromptPlan:
        """The prompt of ``messages`` with ``system_prompt`` (may be ""), through ``render``, so
        that it and ``room`` tokens fit ``n_ctx``; raises when they cannot."""
        ...


class TrimOldest:
    """The chat's rules: see the module docstring."""

    @staticmethod
    def with_system(system_prompt: str, history: Sequence[ChatMessage]) -> list[ChatMessage]:
        """``history``'s messages but its system messages, after the system prompt if any."""
        system = [ChatMessage("system", system_prompt)] if system_prompt else []
        return system + [m for m in history if m.role != "system"]

    def fit(self, render: Render, system_prompt: str, messages: Sequence[ChatMessage],
            prompt_room: int) -> PromptPlan | None:
        """The prompt with the fewest oldest messages left out so that it holds at most
        ``prompt_room`` tokens; None when even the newest message alone does not fit. The
        prompt starts at a user message (whole turns leave), at the first message, or at the
        newest alone.

        Assumes that leaving more out never makes the prompt longer (true of chat templates),
        so the start is found by bisection: a few renderings, however long the chat."""
        history = [m for m in messages if m.role != "system"]
        if not history:
            return None
        starts = [i for i, m in enumerate(history) if i == 0 or m.role == "user"]
        starts += [] if starts[-1] == len(history) - 1 else [len(history) - 1]
        found: dict[int, list[int]] = {}

        def fits(start: int) -> bool:
            try:
                found[start] = render(self.with_system(system_prompt, history[start:]),
                                      prompt_room)
            except PromptOverLimit:
                return False
            return True

        low, high = 0, len(starts) - 1
        if not fits(starts[high]):
            return None
        while low < high:  # the first start that fits is in starts[low:high + 1]
            middle = (low + high) // 2
            if fits(starts[middle]):
                high = middle
            else:
                low = middle + 1
        return PromptPlan(found[starts[low]], starts[low])  # tested, and it fitted

    def plan(self, render: Render, system_prompt: str, messages: Sequence[ChatMessage],
             n_ctx: int, room: int) -> PromptPlan:
        plan = self.fit(render, system_prompt, messages, n_ctx - room)
        if plan is not None:
            return plan
        newest = [m for m in messages if m.role != "system"][-1:]
        try:
            size = f"{len(render(self.with_system(system_prompt, newest), n_ctx))} tokens"
        except PromptOverLimit as over:
            size = f"more than {over.tokens} tokens"
        raise ContextOverflowError(
            f"Your message is {size} with the chat template, and the context window holds "
            f"{n_ctx} with {room} kept for the reply. Shorten the message, or start specchat "
            "with a larger --n-ctx.")


class RefuseTooLong:
    """The API's rules: see the module docstring."""

    def plan(self, render: Render, system_prompt: str, messages: Sequence[ChatMessage],
             n_ctx: int, room: int) -> PromptPlan:
        sent = list(messages)
        if system_prompt and not any(m.role == "system" for m in sent):
            sent.insert(0, ChatMessage("system", system_prompt))
        limit = n_ctx - room
        if len(sent) > limit:  # a token each at least: refused before any tokenization
            raise PromptTooLongError(len(sent), n_ctx, room, at_least=True)
        try:
            return PromptPlan(render(sent, limit))
        except PromptOverLimit as over:
            raise PromptTooLongError(over.tokens, n_ctx, room, at_least=True) from None


@dataclass(frozen=True)
class RawText:
    """The completions API's rules: see the module docstring. An empty ``suffix`` is no
    suffix: the prompt alone, continued."""

    prompt: str
    suffix: str = ""

    def plan(self, render: PromptRender, system_prompt: str, messages: Sequence[ChatMessage],
             n_ctx: int, room: int) -> PromptPlan:
        """The prompt's tokens (system prompt and messages unused); ``PromptTooLongError``,
        ``FimUnsupportedError`` as the module docstring says."""
        limit, before = n_ctx - room, 0
        texts: list[list[int]] = []
        try:
            parts = self._fim_parts(render)
            if parts is None:
                return PromptPlan(render.text(self.prompt, limit))
            fim = render.fim
            if fim is None:
                raise FimUnsupportedError(render.name)
            before = len(fim)
            for part in parts:
                texts.append(render.text(part, limit - before))
                before += len(texts[-1])
        except PromptOverLimit as over:
            raise PromptTooLongError(before + over.tokens, n_ctx, room, True,
                                     "prompt is") from None
        (prefix_id, suffix_id, middle_id), (head, prefix, suffix) = fim, texts
        return PromptPlan([*head, prefix_id, *prefix, suffix_id, *suffix, middle_id])

    def _fim_parts(self, render: PromptRender) -> tuple[str, str, str] | None:
        """``(head, prefix, suffix)`` of a fill-in-the-middle prompt (the head before the prefix
        token: "" but in a client's own), None for a plain one."""
        if self.suffix:
            return "", self.prompt, self.suffix
        spellings = render.fim_spellings
        return None if spellings is None else client_fim(self.prompt, spellings)


def client_fim(prompt: str, spellings: tuple[str, str, str]) -> tuple[str, str, str] | None:
    """``(head, prefix, suffix)`` when ``prompt`` is one a client wrote in the fill-in-the-middle
    form of a model whose three tokens are written ``spellings`` (prefix, suffix, middle):
    ``HEAD<pre>PREFIX<suf>SUFFIX<mid>``, each spelling once, in that order, ``<mid>`` last (as
    Continue's autocompletion writes it for Qwen2.5-Coder); else None."""
    pre, suf, mid = spellings
    if not prompt.endswith(mid) or any(prompt.count(s) != 1 for s in spellings):
        return None
    head, rest = prompt.split(pre)
    if suf not in rest:
        return None
    prefix, suffix = rest[:-len(mid)].split(suf)
    return head, prefix, suffix


TRIM_OLDEST = TrimOldest()
REFUSE_TOO_LONG = RefuseTooLong()


def fallback_template_note(model_name: str) -> str:
    """What to tell the user when ``model_name``'s chat template was missing or failed."""
    return (f"{model_name} has no usable chat template, so the conversation is formatted with a "
            "plain ChatML template; replies may be off. A model file that includes its chat "
            "template (every model in `specchat models` does) avoids this.")
