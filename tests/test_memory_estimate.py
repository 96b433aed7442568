"""A model that will not fit is refused before loading, with the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.backends.memory_estimate import (
    InsufficientMemoryError,
    available_memory,
    check_fits,
    estimate_bytes,
)


def _model(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "m.gguf"
    with path.open("wb") as f:
        f.truncate(size)
    return path


def test_refuses_with_needed_and_available_numbers(tmp_path: Path) -> None:
    path = _model(tmp_path, 3 * 1024**3)
    with pytest.raises(InsufficientMemoryError, match=r"m\.gguf need about 3\.6 GB.*only 2\.0 GB"):
        check_fits([path], "llama", available=2 * 1024**3)


def test_a_model_that_fits_passes(tmp_path: Path) -> None:
    check_fits([_model(tmp_path, 1024**2)], "llama", available=2 * 1024**3)


def test_dequantising_a_gguf_costs_more_than_llama_cpp(tmp_path: Path) -> None:
    path = _model(tmp_path, 1024**3)
    llama = estimate_bytes(path, "llama")
    assert estimate_bytes(path, "hf", "bfloat16") > 2 * llama
    assert estimate_bytes(path, "hf", "float32") > 2 * estimate_bytes(path, "hf", "bfloat16") - 1


MEMINFO = """\
MemTotal:       16303748 kB
MemFree:          812344 kB
MemAvailable:    9876543 kB
Buffers:          123456 kB
"""


def test_available_memory_is_memavailable_in_bytes(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    assert available_memory(meminfo) == 9876543 * 1024  # not MemFree, not MemTotal
    meminfo.write_text(MEMINFO.replace("MemAvailable:    9876543 kB\n", ""))
    assert available_memory(meminfo) is None  # a kernel that does not report it
    assert available_memory(tmp_path / "missing") is None  # not Linux


@pytest.mark.skipif(not Path("/proc/meminfo").is_file(), reason="Linux only")
def test_available_memory_is_read_on_linux() -> None:
    total = next(int(line.split()[1]) * 1024 for line in
                 Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    available = available_memory()
    assert available is not None and 0 < available <= total
