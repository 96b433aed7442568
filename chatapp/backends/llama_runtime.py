"""llama-cpp-python, loaded once per process (``lib``), before any model: kept off its AMX kernels
where a build would crash on them (``chatapp.backends.amx_guard``, decided and applied here), and
its log routed to a ring buffer that error messages quote (``llama_said``) instead of stderr,
unless the environment variable ``SPECCHAT_LLAMA_LOG=1`` is set.

``llama_cpp`` is imported on the first call of ``lib``; this module never imports torch.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any

from chatapp.backends import amx_guard, amx_probe
from chatapp.backends.base import BackendError

_LOG_LEVEL_WARN = 3  # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
_LOG_LEVEL_CONT = 5

_llama: ModuleType | None = None
_log_tail: deque[str] = deque(maxlen=12)
_log_callback: Any = None  # the ctypes callback must stay referenced for as long as C may call it
_guard = amx_guard.AmxGuard.NONE  # how this process keeps llama.cpp off its AMX kernels
_guard_note: str | None = None  # what to tell the user about it, once
_library_dir: Path | None = None  # where llama-cpp-python's native libraries are


def lib() -> ModuleType:
    """Import llama_cpp once, keep it off its AMX kernels, initialise it and route its logging."""
    global _llama, _log_callback, _guard, _guard_note, _library_dir
    if _llama is None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise BackendError("The llama.cpp backend needs llama-cpp-python: "
                               "pip install 'llama-cpp-python>=0.3.16'") from exc
        system_info = llama_cpp.llama_print_system_info().decode(errors="replace")
        library_dir = Path(getattr(llama_cpp.llama_cpp, "_base_path",
                                   Path(llama_cpp.__file__).parent / "lib"))
        _guard, _guard_note = _avoid_amx_kernels(system_info, library_dir)
        _library_dir = library_dir
        _log_callback = llama_cpp.llama_log_callback(_on_log)
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _llama = llama_cpp
    return _llama


def _avoid_amx_kernels(system_info: str, library_dir: Path,
                       ) -> tuple[amx_guard.AmxGuard, str | None]:
    """Decide and apply the AMX guard before any model is loaded (see ``amx_guard``); the guard
    and what to tell the user (nothing when ``SPECCHAT_AMX=off`` asked for it)."""
    forced = amx_guard.forced_off(os.environ)
    guard = amx_guard.plan_guard(amx_guard.cpu_flags(), system_info,
                                 amx_guard.can_filter_syscalls(),
                                 lambda: not forced and amx_probe.amx_is_safe(library_dir))
    if guard is amx_guard.AmxGuard.DENY_PERMISSION and not amx_guard.deny_amx_permission():
        guard = amx_guard.AmxGuard.NO_EXTRA_BUFFERS
    return guard, None if forced else amx_guard.guard_note(guard)


def amx_in_use() -> bool:
    """Whether llama.cpp may run its AMX kernels in this process (after the first model load)."""
    info = lib().llama_print_system_info().decode(errors="replace")
    return (_guard is amx_guard.AmxGuard.NONE
            and amx_guard.cpu_and_build_have_amx(amx_guard.cpu_flags(), info))


def build_identity() -> str:
    """An identity of the llama.cpp build this process runs (its native libraries' names, sizes
    and times: a rebuild changes it)."""
    lib()
    assert _library_dir is not None
    return amx_probe.build_key(_library_dir)


def repacking_allowed() -> bool:
    """Whether models may load with llama.cpp's repacked weights (its "extra" buffer types):
    not where the guard keeps the AMX kernels away by loading without them."""
    return _guard is not amx_guard.AmxGuard.NO_EXTRA_BUFFERS


def runtime_notes() -> list[str]:
    """What the user should be told once about how llama.cpp runs here (empty: nothing)."""
    return [_guard_note] if _guard_note else []


def _on_log(level: int, text: bytes | None, _user_data: Any) -> None:
    """Keep llama.cpp's warnings and errors for error messages; echo all if SPECCHAT_LLAMA_LOG=1."""
    message = (text or b"").decode("utf-8", errors="replace")
    if os.environ.get("SPECCHAT_LLAMA_LOG") == "1":
        sys.stderr.write(message)
    if level == _LOG_LEVEL_CONT and _log_tail:
        _log_tail[-1] += message
    elif level >= _LOG_LEVEL_WARN and message.strip():
        _log_tail.append(message)


def clear_log() -> None:
    """Forget what llama.cpp said so far (before a call whose failure ``llama_said`` explains)."""
    _log_tail.clear()


def llama_said() -> str:
    """The last warnings and errors llama.cpp logged, as a sentence to append to a message."""
    lines = [line.strip() for line in _log_tail if line.strip()]
    return f" llama.cpp said: {' | '.join(lines[-3:])}" if lines else ""
