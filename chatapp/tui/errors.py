"""Readable messages for what can go wrong while loading models or streaming a reply."""

from __future__ import annotations

from chatapp.errors import UserFacingError
from chatapp.settings.config import ConfigError, default_config_path


def describe_error(error: BaseException) -> str:
    """One or two sentences for people: what happened and how to fix it. Never a traceback."""
    if isinstance(error, ConfigError):
        return (f"{error} Fix the setting in {default_config_path()}, with a command-line flag, "
                "or in Settings (F4).")
    if isinstance(error, UserFacingError):
        return str(error)
    if isinstance(error, MemoryError):
        return ("Not enough memory to load or run the models. Pick smaller models (see "
                "`specchat models`), a smaller context window (--n-ctx), or close other programs.")
    if isinstance(error, FileNotFoundError):
        return f"A file is missing: {error}. Check the model path in Settings (F4)."
    text = str(error) or "no details"
    return (f"Unexpected error ({type(error).__name__}: {text}). This looks like a bug in "
            "specchat; please report it with the steps that led here.")
