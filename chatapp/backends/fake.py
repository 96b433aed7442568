"""A deterministic, fast, weight-free backend for tests and UI development.

The "model" is a fixed random table indexed by the last two tokens of the context: the same
context always gives the same logits. A draft is made with the same ``seed`` and a ``noise`` > 0,
which perturbs the table so that some drafts are rejected. Tokens 29 and 30 are the two halves of
"é" to exercise UTF-8-safe streaming. ``delay_s`` sleeps in every ``evaluate`` to mimic real work.
With ``fim``, three more tokens are its fill-in-the-middle tokens (never made by ``tokenize``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence

import numpy as np

from chatapp.backends.base import ModelFacts
from chatapp.backends.chat_template import TemplateMessage, Tools, render_chat
from chatapp.backends.prompt_parts import ControlTokens, PromptPart, assemble
from chatapp.backends.threads import FixedThreads, ThreadChoice

STOP_ID = 0
_PIECES: list[bytes] = (
    [b""]
    + [bytes([c]) for c in range(ord("a"), ord("z") + 1)]
    + [b" ", b"\n", b"\xc3", b"\xa9"]
    + [w.encode() for w in ("the ", "spec", "ulative ", "draft ", "target ", "token ", "is ",
                            "and ", ". ", "You", "user", "assistant", ": ", "?", "!", "K")]
)
_FIM_PIECES = [b"<|fim_prefix|>", b"<|fim_suffix|>", b"<|fim_middle|>"]


class FakeBackend(ModelFacts):
    def __init__(self, seed: int = 0, noise: float = 0.0, n_ctx: int = 4096, sharpness: float = 2.5,
                 delay_s: float = 0.0, name: str = "fake", vocab_size: int | None = None,
                 has_chat_template: bool = True, fim: bool = False) -> None:
        self._name = name
        self._pieces = _PIECES + (_FIM_PIECES if fim else [])
        self._fim_ids = (len(_PIECES), len(_PIECES) + 1, len(_PIECES) + 2) if fim else None
        self._has_chat_template = has_chat_template
        self.uses_fallback_template = False
        self._vocab_size = vocab_size or len(self._pieces)
        self._n_ctx = n_ctx
        self.delay_s = delay_s
        table_rng = np.random.default_rng(seed)
        self._table = table_rng.normal(size=(997, self._vocab_size)) * sharpness
        if noise:
            self._table += np.random.default_rng(seed + 1).normal(size=self._table.shape) * noise
        self._table[:, STOP_ID] -= 3.0  # replies are not over at once
        self._cache: list[int] = []
        self.evaluate_calls: list[int] = []  # number of tokens fed per call, for tests
        self.thread_choice: ThreadChoice = FixedThreads(1)
        self.evaluate_threads: list[int] = []  # the thread count each call was given, for tests

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset({STOP_ID, *(self._fim_ids or ())})

    @property
    def fim_ids(self) -> tuple[int, int, int] | None:
        return self._fim_ids

    @property
    def cached_tokens(self) -> Sequence[int]:
        return tuple(self._cache)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        data, ids = text.encode(), []
        while data:
            token = max((i for i in range(1, len(_PIECES)) if data.startswith(_PIECES[i])),
                        key=lambda i: len(_PIECES[i]), default=None)
            if token is None:
                data = data[1:]  # bytes the toy vocabulary cannot spell are dropped
                continue
            ids.append(token)
            data = data[len(_PIECES[token]):]
        return ids

    def token_bytes(self, token: int) -> bytes:
        return self._pieces[token] if token < len(self._pieces) else b"?"

    def vocab_fingerprint(self) -> str:
        pieces = [self.token_bytes(i) for i in range(self._vocab_size)]
        return hashlib.sha256(b"\0".join(pieces)).hexdigest()

    def chat_prompt(self, messages: Sequence[TemplateMessage], limit: int | None = None,
                    cancel: threading.Event | None = None, tools: Tools = ()) -> list[int]:
        """The fake's one format ("role: content" lines, no control token, a "tools: " line of
        their JSON first); as the protocol says for ``limit``, ``cancel`` and ``tools``.
        ``has_chat_template=False`` reports it as the fallback, which has no tools."""
        self.uses_fallback_template = not self._has_chat_template
        if tools and self.uses_fallback_template:
            render_chat(None, messages, "", "", tools)  # raises: the fallback has no tools
        parts = [PromptPart(f"tools: {json.dumps(list(tools))}\n", True)] if tools else []
        parts += [part for m in messages for part in (
            PromptPart(f"{m.role}: ", False), PromptPart(m.content, True), PromptPart("\n", False))]
        parts.append(PromptPart("assistant: ", False))
        return assemble(parts, ControlTokens({}), self.tokenize, limit, cancel)

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        if len(self._cache) + len(tokens) > self._n_ctx:
            raise RuntimeError("fake context overflow")
        if self.delay_s:
            time.sleep(self.delay_s)
        self.evaluate_calls.append(len(tokens))
        self.evaluate_threads.append(self.thread_choice.choose(len(tokens)))
        self._cache.extend(tokens)
        end = len(self._cache)
        rows = [self._logits_after(self._cache[: end - n_logits + j + 1]) for j in range(n_logits)]
        return np.array(rows, dtype=np.float32).reshape(n_logits, self._vocab_size)

    def truncate(self, n: int) -> None:
        del self._cache[n:]

    def close(self) -> None:
        self._cache.clear()

    def _logits_after(self, context: Sequence[int]) -> np.ndarray:
        a = context[-2] if len(context) >= 2 else 0
        b = context[-1] if context else 0
        return self._table[(a * 131 + b * 7 + len(context) % 3) % len(self._table)]
