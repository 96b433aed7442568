"""A Hugging Face tokenizer's token list as raw bytes, and its stop tokens, so that the
transformers backend and llama.cpp agree on what every id means."""

from __future__ import annotations

import re
from typing import Any

_END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
# The fill-in-the-middle tokens (prefix, suffix, middle) by the names model families give them:
# Qwen2.5-Coder's, then StarCoder's (llama.cpp's vocabulary finds the same names).
_FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
               ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_pieces(tokenizer: Any, vocab_size: int) -> list[bytes]:
    """Raw bytes of every id < ``vocab_size``: added tokens as their text; byte-level BPE tokens
    through the inverse GPT-2 byte table; ``<0xNN>`` byte-fallback tokens as that byte;
    SentencePiece pieces with U+2581 as a space; otherwise ``convert_tokens_to_string``.
    Ids the tokenizer does not have give b"", and so do the ``[PAD<id>]`` placeholders that a
    tokenizer converted from GGUF has for the padding rows of the embedding: llama.cpp marks
    those ids unused and gives them no text, so both backends agree on the token list."""
    count = min(len(tokenizer), vocab_size)
    strings = tokenizer.convert_ids_to_tokens(list(range(count)))
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    byte_level = _is_byte_level(tokenizer)
    pieces = []
    for token, string in enumerate(strings):
        if token in added:
            pieces.append(added[token].encode())
        elif string is None or string == f"[PAD{token}]":
            pieces.append(b"")
        else:
            pieces.append(_piece_bytes(string, byte_level, tokenizer))
    return pieces + [b""] * (vocab_size - count)


def _piece_bytes(string: str, byte_level: bool, tokenizer: Any) -> bytes:
    if byte_level:
        try:
            return string.translate(_BYTE_LEVEL_TABLE).encode("latin-1")
        except UnicodeEncodeError:
            pass  # a character outside the byte table: not a byte-level piece
    if match := _BYTE_FALLBACK.fullmatch(string):
        return bytes([int(match.group(1), 16)])
    if "\u2581" in string:
        return string.replace("\u2581", " ").encode()
    return tokenizer.convert_tokens_to_string([string]).encode()


def _is_byte_level(tokenizer: Any) -> bool:
    """True when the fast tokenizer's decoder is (or contains) the ByteLevel decoder."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return decoder is not None and b'"ByteLevel"' in decoder.__getstate__()


def _byte_level_table() -> dict[int, str]:
    """A ``str.translate`` table inverting GPT-2's bytes_to_unicode: each stand-in character
    becomes the latin-1 character of its byte. Characters below 256 that are not stand-ins map
    to U+FFFF, so encoding the result to latin-1 fails on anything that is not a byte-level
    piece."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table |= {256 + i: chr(b) for i, b in enumerate(others)}
    table |= {b: "\uffff" for b in others}
    return table


_BYTE_LEVEL_TABLE = _byte_level_table()


def stop_ids(model: Any, tokenizer: Any, vocab_size: int) -> frozenset[int]:
    """EOS ids of the generation config, the config and the tokenizer, plus the end-of-turn
    tokens the tokenizer knows, all below ``vocab_size``."""
    ids: set[int] = set()
    for holder in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(holder, "eos_token_id", None)
        ids.update(value if isinstance(value, (list, tuple, set)) else [value])
    vocab = tokenizer.get_vocab()
    ids.update(vocab.get(text) for text in _END_OF_TURN_TOKENS)
    ids.update(fim_ids(tokenizer, vocab_size) or ())
    return frozenset(i for i in ids if isinstance(i, int) and 0 <= i < vocab_size)


def fim_ids(tokenizer: Any, vocab_size: int) -> tuple[int, int, int] | None:
    """The tokenizer's fill-in-the-middle tokens (prefix, suffix, middle) by their names, all
    below ``vocab_size``; None unless one family's three are there."""
    vocab = tokenizer.get_vocab()
    for names in _FIM_TOKENS:
        ids = tuple(vocab.get(name) for name in names)
        if all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
            return ids  # type: ignore[return-value]
    return None
