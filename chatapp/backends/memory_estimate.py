"""Estimate a model's memory before loading it, and refuse one that cannot fit.

Loading a model that does not fit makes the machine swap or the kernel kill the process; a clear
refusal with the numbers is better. Estimates are deliberately rough upper bounds:
- llama.cpp: the GGUF's size (weights are used as stored) plus the KV cache and compute buffers.
- transformers: a GGUF is dequantised (Q4 ~4.5-5 bits/weight -> 16 or 32), a model folder holds
  safetensors whose size scales with the dtype it is loaded in.
"""

from __future__ import annotations

from pathlib import Path

from chatapp.errors import UserFacingError

_GB = 1024**3
_LLAMA_OVERHEAD = 1.15  # KV cache at n_ctx 4096, compute buffers, repacking slack
_LLAMA_FIXED = 200 * 1024**2
_GGUF_BITS_PER_WEIGHT = 4.5  # the common Q4 quantisations, a lower bound that overestimates memory
_BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2}


class InsufficientMemoryError(UserFacingError):
    """The model would not fit in the memory that is available."""


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable, read from ``meminfo``),
    or None if unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def model_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return path.stat().st_size


def estimate_bytes(path: Path, backend: str, dtype: str = "float32") -> int:
    """A rough upper bound of the resident memory of the loaded model."""
    size = model_bytes(path)
    if backend == "llama":
        return int(size * _LLAMA_OVERHEAD) + _LLAMA_FIXED
    bytes_per_param = _BYTES_PER_PARAM.get(dtype, 4)
    if path.is_file():  # a GGUF, dequantised on load
        return int(size * 8 / _GGUF_BITS_PER_WEIGHT * bytes_per_param * 1.1)
    return int(size * 1.1)  # safetensors are loaded in their stored dtype by default


def check_fits(paths: list[Path], backend: str, dtype: str = "float32",
               available: int | None = None) -> None:
    """Raise ``InsufficientMemoryError`` when the models together would not fit."""
    available = available if available is not None else available_memory()
    if available is None:
        return
    needed = sum(estimate_bytes(path, backend, dtype) for path in paths)
    if needed > available:
        names = " + ".join(path.name for path in paths)
        raise InsufficientMemoryError(
            f"{names} need about {needed / _GB:.1f} GB of memory on the {backend} backend, but "
            f"only {available / _GB:.1f} GB is available. Close other programs, pick smaller "
            "models, or use the llama backend (quantised weights) instead of hf."
        )
