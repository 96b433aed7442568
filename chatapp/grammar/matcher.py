"""llguidance's matcher as the engine's ``TokenConstraint``, and the compiler that makes them for
one backend (``Grammars``)."""

from __future__ import annotations

from typing import NoReturn

import llguidance
import numpy as np

from chatapp.backends.base import Backend
from chatapp.errors import UserFacingError
from chatapp.grammar.vocabulary import grammar_tokenizer


class GrammarError(UserFacingError):
    """A grammar llguidance cannot compile (an unsupported or invalid JSON schema)."""


class GrammarConstraint:
    """One reply's state in a compiled grammar (``chatapp.engine.constraint.TokenConstraint``).

    Where llguidance fails (it refuses a token its mask allowed, or a rollback, or no token of
    the vocabulary can go on), ``GrammarError``: the reply cannot go on."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """As the protocol says; ``GrammarError`` where no token of the vocabulary can go on
        (a grammar that needs text the model's tokens cannot spell)."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, count=self._vocab_size, bitorder="little").astype(bool)
        if self._matcher.is_error():  # llguidance then allows the stop tokens alone
            reason = self._matcher.get_error().splitlines()[0]
            raise GrammarError("No token of the model's vocabulary can continue the reply's "
                               f"grammar here ({reason}).")
        return mask

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            self._fail(f"it refused token {token}, which its mask allowed")

    def rollback(self, n: int) -> None:
        if n and not self._matcher.rollback(n):
            self._fail(f"it could not roll back {n} tokens")

    def _fail(self, what: str) -> NoReturn:
        reason = self._matcher.get_error().splitlines()[0]
        raise GrammarError(f"The grammar engine failed: {what} ({reason}).")

    @property
    def accepting(self) -> bool:
        return self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        return self._matcher.is_stopped()


class Grammars:
    """Compiles grammars for ``backend``'s vocabulary; its tokenizer is built on first use (about
    a second for a 152k-token vocabulary) and kept. Not thread-safe: use it from the thread that
    runs the models."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._tokenizer: llguidance.LLTokenizer | None = None

    def constraint(self, lark: str, purpose: str) -> GrammarConstraint:
        """A new reply's constraint for ``lark`` (llguidance's Lark dialect, ``%json {...}``
        for a JSON schema); ``GrammarError`` naming ``purpose`` when it does not compile."""
        if self._tokenizer is None:
            self._tokenizer = grammar_tokenizer(self._backend)
        matcher = llguidance.LLMatcher(self._tokenizer, lark, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"The {purpose} cannot be used as a grammar: "
                               f"{matcher.get_error().splitlines()[0]}")
        return GrammarConstraint(matcher, self._backend.vocab_size)
