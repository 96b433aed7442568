"""A GGUF file's first bytes: whether a path holds a GGUF model, checked before a library reads it
(llama.cpp can crash the process on some malformed input, so garbage never reaches it)."""

from __future__ import annotations

from pathlib import Path

from chatapp.backends.base import BackendError

GGUF_MAGIC = b"GGUF"
GGUF_HEADER_BYTES = 24  # magic, version (u32), tensor count (u64), metadata count (u64)


def is_gguf(path: Path) -> bool:
    """Whether the file at ``path`` starts with the GGUF magic (``OSError`` if it cannot be
    read)."""
    with path.open("rb") as f:
        return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def check_gguf_file(path: Path) -> None:
    """Raise ``BackendError`` unless ``path`` is a readable file that starts like a GGUF model."""
    if not path.exists():
        raise BackendError(f"Model file not found: {path}. Check the path, or run `specchat "
                           "models` to see the installed models and where they are.")
    if not path.is_file():
        raise BackendError(f"Model path {path} is not a file; give the path of a .gguf file.")
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise BackendError(f"Cannot read the model file {path}: {exc}.") from exc
    if head != GGUF_MAGIC:
        raise BackendError(
            f"{path} is not a GGUF model (it starts with {head!r}, not {GGUF_MAGIC!r}). The "
            "llama.cpp backend needs a .gguf file; if the model came in parts, join them in "
            "order first.")
    if size <= GGUF_HEADER_BYTES:
        raise BackendError(f"{path} is only {size} bytes: the GGUF file is truncated. Download or "
                           "assemble it again and check its sha256.")
