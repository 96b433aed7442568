"""The protocol every model backend (llama.cpp, transformers, fake) implements.

A backend wraps one loaded model and its KV cache. It knows its library; it knows nothing of
speculation. The engine drives two of them (draft and target) through this protocol only.

KV-cache contract: ``cached_tokens`` is exactly the token sequence whose keys/values are in the
cache, in order. ``evaluate(tokens, n_logits)`` appends ``tokens`` to the cache and returns the
logits (float32, shape (n_logits, vocab_size)) predicted after each of the last ``n_logits`` of
them (row j is the distribution of the token that follows ``tokens[len(tokens) - n_logits + j]``).
``truncate(n)`` drops every cached position >= n. Evaluating after a truncate must give the same
logits as a fresh evaluation of the same sequence.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from chatapp.backends.chat_template import TemplateMessage, Tools
from chatapp.backends.threads import ThreadChoice
from chatapp.errors import UserFacingError


class BackendError(UserFacingError, RuntimeError):
    """A model could not be loaded or run; the message says what to do about it."""


class ModelFacts:
    """What every backend keeps about its loaded model, and the ``Backend`` properties that only
    read it. A backend sets ``_name``, ``_vocab_size``, ``_n_ctx`` and ``thread_choice`` when it
    loads; ``use_threads`` lets another part (the bench) choose the thread count instead."""

    _name: str
    _vocab_size: int
    _n_ctx: int
    thread_choice: ThreadChoice

    @property
    def name(self) -> str:
        return self._name

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def threads(self) -> int:
        """The CPU thread count evaluations use now."""
        return self.thread_choice.current

    def use_threads(self, choice: ThreadChoice) -> None:
        """Choose the thread count of later evaluations with ``choice`` (e.g. the bench's)."""
        self.thread_choice = choice


@runtime_checkable
class Backend(Protocol):
    uses_fallback_template: bool
    """True after ``chat_prompt`` when the model had no usable chat template of its own and the
    conversation was formatted with plain ChatML instead (the UI tells the user)."""

    @property
    def name(self) -> str:
        """Short human-readable model name, for the UI and error messages."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of token ids; logits rows have this length."""
        ...

    @property
    def n_ctx(self) -> int:
        """Maximum number of positions the KV cache can hold."""
        ...

    @property
    def threads(self) -> int:
        """The CPU thread count the model's evaluations use now (it may adapt between them)."""
        ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that end the assistant's turn (EOS, end-of-turn)."""
        ...

    @property
    def fim_ids(self) -> tuple[int, int, int] | None:
        """The model's fill-in-the-middle tokens (prefix, suffix, middle: ``<|fim_prefix|>``,
        ``<|fim_suffix|>``, ``<|fim_middle|>`` for Qwen2.5-Coder), None for a model without
        them. They are among ``stop_ids``: a reply ends where the model writes one."""
        ...

    @property
    def cached_tokens(self) -> Sequence[int]:
        ...

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``; no BOS is added. ``special`` parses control tokens in the text."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes a token stands for (may be part of a UTF-8 character)."""
        ...

    def vocab_fingerprint(self) -> str:
        """A digest of the full token list; equal fingerprints mean the same vocabulary."""
        ...

    def chat_prompt(self, messages: Sequence[TemplateMessage], limit: int | None = None,
                    cancel: threading.Event | None = None, tools: Tools = ()) -> list[int]:
        """Apply the model's chat template (with the assistant generation prompt) and tokenize:
        control tokens come from the template's markup only, every content is plain text
        (``chatapp.backends.prompt_parts``). ``PromptOverLimit`` as soon as the prompt is known
        to pass ``limit`` tokens; ``PromptCancelled`` once ``cancel`` is set; ``tools`` go to
        the template (``RequestRefused`` when it has none: ``chat_template.render_chat``)."""
        ...

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        ...

    def truncate(self, n: int) -> None:
        ...

    def close(self) -> None:
        """Release the model and its memory. Safe to call twice."""
        ...
