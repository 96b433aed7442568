"""A backend's vocabulary as llguidance's tokenizer.

llguidance needs every token's bytes, which tokens are special (markup that text never spells:
llguidance marks them with a leading 0xFF byte and never allows them inside a grammar's text),
the stop tokens (allowed where the grammar accepts) and a function that tokenizes text. A
``Backend`` gives its tokens' bytes, its stop tokens and its tokenizer; a token counts as special
when it is a stop token, or reads like markup (``<...>``) and plain tokenization of its text
does not give it back (llama.cpp parses control tokens only on request), as llguidance's own
llama.cpp bridge does for control tokens.
"""

from __future__ import annotations

import llguidance

from chatapp.backends.base import Backend

SPECIAL_MARK = b"\xff"  # llguidance's prefix of a special token's bytes


def grammar_tokenizer(backend: Backend) -> llguidance.LLTokenizer:
    """``backend``'s vocabulary (``vocab_size`` tokens, the logits' width) as llguidance's
    tokenizer. Reads every token once: build it once per backend."""
    tokens = [_token_bytes(backend, token) for token in range(backend.vocab_size)]
    wrapper = llguidance.TokenizerWrapper(_Vocabulary(backend, tokens))
    return llguidance.LLTokenizer(wrapper, n_vocab=backend.vocab_size,
                                  eos_token=sorted(backend.stop_ids))


def _token_bytes(backend: Backend, token: int) -> bytes:
    """The token's bytes, marked special where it is (see the module docstring)."""
    data = backend.token_bytes(token)
    if token in backend.stop_ids or _is_markup(backend, token, data):
        return SPECIAL_MARK + data
    return data


def _is_markup(backend: Backend, token: int, data: bytes) -> bool:
    if len(data) < 3 or not (data.startswith(b"<") and data.endswith(b">")):
        return False
    return backend.tokenize(data.decode("utf-8", "replace")) != [token]


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads of a tokenizer."""

    def __init__(self, backend: Backend, tokens: list[bytes]) -> None:
        self.tokens = tokens
        self.eos_token_id = min(backend.stop_ids)
        self.bos_token_id = None
        self._backend = backend

    def __call__(self, text: str | bytes) -> list[int]:
        """The tokens of ``text`` as plain text (no special token parsed)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._backend.tokenize(text)
