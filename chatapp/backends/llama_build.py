"""Build llama-cpp-python for this CPU, with llama.cpp's AMX kernels made safe: ``python -m
chatapp.backends.llama_build``.

llama.cpp's AMX kernels fail in two ways, both in ``ggml_tile_config_init``
(``ggml/src/ggml-cpu/amx/mmq.cpp``), which fills a 64-byte tile configuration and loads it:

- compiled by GCC 12 (Debian 12's compiler), ``_tile_loadconfig`` hands the configuration to its
  asm as an 8-byte memory operand, so the stores that fill in the rows and column widths are
  optimised away and the first tile instruction faults (llama.cpp issue 20824, fix proposed in
  PR 26954; no llama-cpp-python release carries it). One empty asm statement that reads the whole
  configuration keeps the stores (``AMX_FIX``); it changes nothing where the compiler already
  keeps them (GCC 13+, clang);
- it loads the configuration once per thread and never again, while another library of the
  process may release the tiles on the same thread (PyTorch does, with the transformers backend
  beside a llama.cpp draft): the next tile instruction then faults (SIGILL). Loading it at every
  call (``RELOAD_FIX``) costs one instruction per matrix product and thread.

This module fetches the pinned sdist with pip, checks its sha256, applies both fixes, and installs
it with pip, compiled for the CPU it runs on (``GGML_NATIVE``: AMX where the CPU has it, AVX-512 or
AVX2 elsewhere) and with llama.cpp's RPC backend (a target on other machines). Standard library
only: it runs from a source checkout before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CMAKE_ARGS = "-DGGML_RPC=on -DGGML_NATIVE=on"

MMQ_PATH = "vendor/llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp"
AMX_ANCHOR = "    _tile_loadconfig(&tc);\n"
AMX_FIX = ('    __asm__ volatile("" :: "m"(tc));  // specchat: keep the stores '
           "(llama.cpp #20824, PR #26954)\n")
RELOAD_ANCHOR = "    if (done) {\n        return;\n    }\n"
RELOAD_FIX = ("    // specchat: load the configuration at every call: another AMX user of the "
              "process may have\n    // released the tiles on this thread since\n")

FULL_BUILD_COMMAND = "python -m chatapp.backends.llama_build"


class BuildError(RuntimeError):
    """The build cannot go on; the message says why and what to do."""


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(folder: Path) -> Path:
    """Download the pinned sdist into ``folder`` with pip and check its sha256."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--dest", str(folder), f"llama-cpp-python=={VERSION}"], check=True)
    sdist = folder / SDIST_NAME
    if not sdist.is_file():
        raise BuildError(f"pip did not save {SDIST_NAME} in {folder}")
    found = sha256_of(sdist)
    if found != SDIST_SHA256:
        raise BuildError(f"{SDIST_NAME} has sha256 {found}, not the pinned {SDIST_SHA256}: "
                         "the package index served another file; not building it")
    return sdist


def apply_amx_fix(source: Path) -> None:
    """Insert ``AMX_FIX`` before the one ``_tile_loadconfig(&tc)`` call of ``MMQ_PATH`` and put
    ``RELOAD_FIX`` in place of its once-per-thread early return.

    Raises ``BuildError`` unless each anchor occurs exactly once (another llama.cpp version), or
    the fixes are already there (idempotent).
    """
    mmq = source / MMQ_PATH
    text = mmq.read_text()
    if AMX_FIX not in text:
        text = _replace_once(text, AMX_ANCHOR, AMX_FIX + AMX_ANCHOR)
    if RELOAD_FIX not in text:
        text = _replace_once(text, RELOAD_ANCHOR, RELOAD_FIX)
    mmq.write_text(text)


def _replace_once(text: str, anchor: str, replacement: str) -> str:
    if text.count(anchor) != 1:
        raise BuildError(f"{MMQ_PATH} has {text.count(anchor)} places for a fix "
                         f"({anchor.strip()!r}), not one: this is not the llama.cpp the fixes "
                         "were written for")
    return text.replace(anchor, replacement)


def unpack(sdist: Path, folder: Path) -> Path:
    """Extract ``sdist`` into ``folder``; the source tree's path."""
    with tarfile.open(sdist) as archive:
        archive.extractall(folder, filter="data")
    return folder / SDIST_NAME.removesuffix(".tar.gz")


def install(source: Path, cmake_args: str) -> None:
    """pip-install the source tree, compiled anew (never a cached wheel)."""
    env = dict(os.environ, CMAKE_ARGS=cmake_args)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall",
                    str(source)], check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chatapp.backends.llama_build",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cmake-args", default=CMAKE_ARGS,
                        help=f"CMake options (default: {CMAKE_ARGS!r}; add e.g. -DGGML_CUDA=on)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specchat-llama-build-") as tmp:
        try:
            source = unpack(fetch_sdist(Path(tmp)), Path(tmp))
            apply_amx_fix(source)
            print(f"llama-cpp-python {VERSION}: sha256 checked, AMX fixes applied; compiling "
                  "(about 7 minutes on 2 cores)", flush=True)
            install(source, args.cmake_args)
        except BuildError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        except subprocess.CalledProcessError as error:
            print(f"error: {' '.join(error.cmd[:4])} ... failed (exit {error.returncode})",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
