"""What a GGUF file's header says about its model, read with the ``gguf`` package (llama.cpp's
own reader), and kept between starts.

``GgufFacts`` holds the architecture, family, parameter count, quantisation, trained context,
whether a chat template and FIM tokens are present, and the vocabulary fingerprint: a sha256 of
the raw token list and every special token id. Two files with the same fingerprint tokenise
alike, so one can draft for the other.

``model_facts(path)`` reads a file once per (path, size, modification time): the facts are kept
in ``model_facts.json`` in specchat's state folder, never beside the model (which may lie in
another tool's folder). A file the reader cannot parse (a truncated file among them: its last
tensors do not fit) raises ``UnreadableModelError`` whose text says so in one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.errors import UserFacingError
from chatapp.user_files import read_json_object, remember_json, state_dir

FIM_TOKENS = ("<|fim_prefix|>", "<fim_prefix>", "<|fim_begin|>", "<PRE>", "<fim-prefix>")
_SPECIAL_ID_SUFFIX = "_token_id"


class UnreadableModelError(UserFacingError):
    """A file is not a complete GGUF model (truncated, damaged, or no GGUF at all)."""


@dataclass(frozen=True)
class GgufFacts:
    """A GGUF model's facts (``parameters``: weights counted over every tensor)."""

    architecture: str
    family: str  # general.basename, else the architecture
    parameters: int
    quantisation: str
    context: int | None
    chat_template: bool
    fim: bool
    vocab_size: int
    vocab_fingerprint: str


def model_facts(path: Path) -> GgufFacts:
    """The facts of the GGUF file ``path``: from the state folder's cache when its size and
    modification time are unchanged, else read now (a second or a few) and cached (the cache
    forgets files that are gone).
    ``UnreadableModelError`` for a file that is not a complete GGUF model, ``OSError`` for one
    that cannot be opened."""
    stat = path.stat()
    key = str(path.resolve())
    stamp = [stat.st_size, stat.st_mtime_ns]
    cache_path = state_dir() / "model_facts.json"
    cache = read_json_object(cache_path)
    kept = cache.get(key)
    if isinstance(kept, dict) and kept.get("stamp") == stamp:
        try:
            return GgufFacts(**kept["facts"])
        except TypeError:
            pass  # kept by another version: read again
    facts = read_facts(path)
    kept_files = {name: entry for name, entry in cache.items() if Path(name).exists()}
    remember_json(cache_path, kept_files | {key: {"stamp": stamp,
                                                  "facts": dataclasses.asdict(facts)}})
    return facts


def read_facts(path: Path) -> GgufFacts:
    """Read the facts of ``path`` from its GGUF header (no cache)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        return _facts(reader)
    except OSError:
        raise
    except Exception as error:  # the reader fails in many ways on a damaged file
        raise UnreadableModelError(
            f"{path} is not a complete GGUF model ({_reason(error)}); download it again") from None


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:120]


def _facts(reader: Any) -> GgufFacts:
    from gguf import LlamaFileType

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return field.contents() if field is not None else None

    architecture = str(value("general.architecture") or "unknown")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError("no token list")
    file_type = value("general.file_type")
    try:
        quantisation = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if (
            file_type is not None) else "unknown"
    except ValueError:
        quantisation = f"file type {file_type}"
    return GgufFacts(
        architecture=architecture,
        family=str(value("general.basename") or architecture),
        parameters=sum(int(tensor.n_elements) for tensor in reader.tensors),
        quantisation=quantisation,
        context=value(f"{architecture}.context_length"),
        chat_template=value("tokenizer.chat_template") is not None,
        fim=_has_fim(reader, tokens),
        vocab_size=len(tokens.data),
        vocab_fingerprint=_fingerprint(reader, tokens),
    )


def _has_fim(reader: Any, tokens: Any) -> bool:
    """Whether the model names fill-in-the-middle tokens (by metadata or by its token list)."""
    if any(key in reader.fields for key in ("tokenizer.ggml.fim_pre_token_id",
                                              "tokenizer.ggml.prefix_token_id")):
        return True
    return any(marker.encode() in _raw(reader, tokens) for marker in FIM_TOKENS)


def _raw(reader: Any, field: Any) -> bytes:
    """The bytes of ``field`` as they lie in the file (name, type and value)."""
    length = sum(int(part.nbytes) for part in field.parts)
    return bytes(reader.data[field.offset:field.offset + length])


def _fingerprint(reader: Any, tokens: Any) -> str:
    """sha256 over the raw token list and every ``tokenizer.ggml.*_token_id`` with its value."""
    digest = hashlib.sha256(_raw(reader, tokens))
    for key in sorted(reader.fields):
        if key.startswith("tokenizer.ggml.") and key.endswith(_SPECIAL_ID_SUFFIX):
            digest.update(f"\n{key}={reader.fields[key].contents()}".encode())
    return digest.hexdigest()
