"""Keep llama.cpp off its AMX kernels where this build would crash on them (llama.cpp issue 20824).

A llama.cpp built with ``-march=native`` on a CPU with AMX compiles ggml's AMX matrix kernels; at
model load ggml asks the kernel for permission to use the AMX tile registers
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``), and where that succeeds it puts quantised weights in an "AMX"
buffer. Compiled by GCC 12 without the fix of ``chatapp.backends.llama_build``, those kernels
fault on the first batched evaluation; with it they verify batches several times faster. Which
build this is, a probe in a child process finds out once per build (``chatapp.backends.amx_probe``).
Where permission is refused, ggml skips the AMX buffer and uses its regular CPU repack.

``plan_guard`` decides from the CPU's flags, the build's feature list and the probe's verdict:

- ``AmxGuard.NONE``: the CPU or the build has no AMX, or the build's AMX kernels are safe here.
- ``AmxGuard.DENY_PERMISSION``: a seccomp filter makes ``arch_prctl(ARCH_REQ_XCOMP_PERM)`` fail with
  EPERM for this process and its children (Linux x86-64), before any model is loaded.
- ``AmxGuard.NO_EXTRA_BUFFERS``: where no filter can be installed, models load with
  ``use_extra_bufts = false`` (no AMX buffer and no repack: about 20% slower decoding, no crash).

A guarded user is told once, with the command that builds llama-cpp-python with the fix
(``FULL_BUILD_COMMAND``). ``SPECCHAT_AMX=off`` in the environment guards whatever the build (to
compare the two paths). Only the llama.cpp path applies it; PyTorch keeps AMX unless a llama.cpp
model is loaded in the same process.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import platform
from collections.abc import Callable, Mapping
from pathlib import Path

from chatapp.backends.llama_build import FULL_BUILD_COMMAND

_AMX_CPU_FLAGS = frozenset({"amx_tile", "amx_int8"})  # what ggml's AMX kernels execute

# Linux x86-64 constants (linux/audit.h, asm/unistd_64.h, asm/prctl.h, linux/seccomp.h,
# linux/filter.h)
_AUDIT_ARCH_X86_64 = 0xC000003E
_NR_ARCH_PRCTL = 158
_NR_SECCOMP = 317
_ARCH_REQ_XCOMP_PERM = 0x1023
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16  # in struct seccomp_data


class AmxGuard(enum.Enum):
    NONE = "none"
    DENY_PERMISSION = "deny-permission"
    NO_EXTRA_BUFFERS = "no-extra-buffers"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The flags of the first CPU in ``cpuinfo`` (empty where the file does not exist)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_amx(flags: frozenset[str]) -> bool:
    """Whether a CPU with these ``cpu_flags`` executes the AMX instructions ggml's kernels use."""
    return _AMX_CPU_FLAGS <= flags


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as ``lscpu`` shows it (the machine type where none is given)."""
    try:
        return next((line.partition(":")[2].strip() for line in
                     cpuinfo.read_text(errors="replace").splitlines()
                     if line.startswith("model name")), "") or platform.machine()
    except OSError:
        return platform.machine()


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and the vector features llama.cpp's kernels use, for reports."""
    flags = cpu_flags(cpuinfo)
    features = [name for name, present in (("AMX", cpu_has_amx(flags)),
                                           ("AVX-512", "avx512f" in flags),
                                           ("AVX2", "avx2" in flags)) if present]
    return f"{cpu_model_name(cpuinfo)} ({', '.join(features) or 'no AMX, AVX-512 or AVX2'})"


def build_has_amx(system_info: str) -> bool:
    """Whether llama.cpp's ``llama_print_system_info()`` lists the AMX kernels as compiled in."""
    features = {name.strip(): value.strip() for part in system_info.split("|")
                for name, sep, value in [part.rpartition("=")] if sep}
    return features.get("AMX_INT8") == "1"


def cpu_and_build_have_amx(flags: frozenset[str], system_info: str) -> bool:
    """Whether the CPU runs AMX and the build (``llama_print_system_info()``) compiled it in."""
    return cpu_has_amx(flags) and build_has_amx(system_info)


def plan_guard(flags: frozenset[str], system_info: str, can_filter: bool,
               amx_safe: Callable[[], bool]) -> AmxGuard:
    """What keeps this process off the AMX kernels (see the module notes). ``amx_safe`` (the
    probe) is asked only where both the CPU and the build have AMX."""
    if not cpu_and_build_have_amx(flags, system_info) or amx_safe():
        return AmxGuard.NONE
    return AmxGuard.DENY_PERMISSION if can_filter else AmxGuard.NO_EXTRA_BUFFERS


def forced_off(environ: Mapping[str, str]) -> bool:
    """Whether the user asked for AMX off (``SPECCHAT_AMX=off``)."""
    return environ.get("SPECCHAT_AMX", "").strip().lower() == "off"


def can_filter_syscalls() -> bool:
    """True on Linux x86-64, where ``deny_amx_permission`` can work."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _deny_xcomp_program() -> ctypes.Array[_SockFilter]:
    """BPF: arch_prctl(ARCH_REQ_XCOMP_PERM, ...) on x86-64 fails with EPERM; all else is allowed."""
    allow = 7  # index of the ALLOW return below; jumps count from the next instruction
    program = [
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        (_BPF_JEQ_K, 0, allow - 2, _AUDIT_ARCH_X86_64),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_NR),
        (_BPF_JEQ_K, 0, allow - 4, _NR_ARCH_PRCTL),
        (_BPF_LD_W_ABS, 0, 0, _OFFSET_ARG0),
        (_BPF_JEQ_K, 0, allow - 6, _ARCH_REQ_XCOMP_PERM),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    return (_SockFilter * len(program))(*(_SockFilter(*row) for row in program))


def deny_amx_permission() -> bool:
    """Install the seccomp filter on every thread of this process (and its future children).

    Irreversible for the process. Returns False, changing nothing, where it cannot be installed.
    """
    if not can_filter_syscalls():
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    program = _deny_xcomp_program()
    fprog = _SockFprog(len(program), program)
    result = libc.syscall(_NR_SECCOMP, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC,
                          ctypes.byref(fprog))
    return result == 0


def request_amx_permission() -> int:
    """Ask the kernel for the AMX tile state as ggml does; 0 or the errno (for tests)."""
    libc = ctypes.CDLL(None, use_errno=True)
    xfeature_xtiledata = 18
    if libc.syscall(_NR_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, xfeature_xtiledata) == 0:
        return 0
    return ctypes.get_errno()


def guard_note(guard: AmxGuard) -> str | None:
    """What to tell the user about ``guard`` (None: nothing happened)."""
    if guard is AmxGuard.NONE:
        return None
    done = ("specchat keeps llama.cpp off them, and verifying several tokens at once costs more "
            "than it would with them" if guard is AmxGuard.DENY_PERMISSION else
            "specchat loads models without llama.cpp's weight repacking to avoid them "
            "(about 20% slower)")
    return ("This llama-cpp-python build's AMX kernels crash on this CPU (llama.cpp issue 20824, "
            f"GCC 12 without the fix); {done}. To build it with the fix: {FULL_BUILD_COMMAND}")

