"""Whether this llama-cpp-python build's AMX kernels run on this CPU, found out in a child process.

A llama.cpp compiled by GCC 12 without the fix (``chatapp.backends.llama_build``) faults on its
first AMX tile instruction (llama.cpp issue 20824); one compiled with the fix, or by a compiler
without the bug, runs them and verifies batches several times faster. Nothing in the build's
feature list tells the two apart, so ``amx_is_safe`` asks: a child process loads a tiny model
made here (``write_probe_model``: one layer, Q8_0 weights, shapes that ggml's AMX kernels take)
and evaluates a batch, which goes through the tile kernels; then it releases the tiles, as another
AMX user of the process (PyTorch) does, and evaluates a second batch, which a build that loads its
tile configuration once per thread does not survive (``llama_build``'s second fix). The child
either prints ``ok`` or dies; the parent is never at risk.

The answer is remembered per build (``build_key``: the native libraries' names, sizes and
modification times) in ``<user state dir>/amx-probe.json``, so the probe runs once per build.
Only a clear answer is remembered: a child that printed ``ok``, or one the kernel stopped for
what the AMX kernels do wrong (SIGILL, SIGSEGV, SIGBUS). A probe that fails another way (a
timeout, an import error, another signal such as the out-of-memory killer's SIGKILL) counts as
unsafe for this start only.
"""

from __future__ import annotations

import enum
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from chatapp.user_files import (
    cache_dir,
    private_dir,
    read_json_object,
    remember_json,
    state_dir,
)

PROBE_MODEL_VERSION = 1
PROBE_VERSION = 2  # what a verdict means (2: the tiles released between two batches)
_TILERELEASE_RET = bytes([0xC4, 0xE2, 0x78, 0x49, 0xC0, 0xC3])  # tilerelease; ret
PROBE_TIMEOUT_S = 60.0
KERNEL_CRASHES = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS})
_EMBED, _FFN, _HEADS, _VOCAB = 64, 128, 2, 64  # multiples of 32: AMX's Q8_0 tiles take them
_PROBE_BATCH = 16  # a batch of 2+ tokens takes the tile kernels (one token a VNNI path)


class Verdict(enum.Enum):
    SAFE = "safe"
    CRASHES = "crashes"
    UNKNOWN = "unknown"  # the probe failed for another reason; not remembered


def build_key(library_dir: Path) -> str:
    """An identity of the native libraries in ``library_dir`` (a rebuild changes it) and of the
    probe that judges them."""
    digest = hashlib.sha256(f"probe {PROBE_VERSION}\0".encode())
    for path in sorted(library_dir.glob("*.so*")) + sorted(library_dir.glob("*.dylib")):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:32]


def memory_path() -> Path:
    return state_dir() / "amx-probe.json"


def recalled_verdict(key: str, path: Path) -> Verdict | None:
    """What an earlier probe found for the build ``key`` (None: never probed, or unreadable)."""
    value = read_json_object(path).get(key)
    return Verdict(value) if value in (Verdict.SAFE.value, Verdict.CRASHES.value) else None


def remember_verdict(key: str, verdict: Verdict, path: Path) -> None:
    """Keep a clear ``verdict`` for ``key`` (best effort: a failed write only costs a probe)."""
    if verdict is Verdict.UNKNOWN:
        return
    known = read_json_object(path)
    known[key] = verdict.value
    remember_json(path, known, indent=1)


def write_probe_model(path: Path) -> None:
    """A one-layer llama-architecture GGUF with random Q8_0 weights and no tokenizer."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(_EMBED)
    writer.add_block_count(1)
    writer.add_feed_forward_length(_FFN)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_HEADS)
    writer.add_rope_dimension_count(_EMBED // _HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(_VOCAB)

    def quantized(name: str, rows: int, cols: int) -> None:
        data = rng.standard_normal((rows, cols), dtype=np.float32) * 0.05
        q8 = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)

    writer.add_tensor("token_embd.weight", rng.standard_normal((_VOCAB, _EMBED), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(_EMBED, dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(_EMBED, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(_EMBED, dtype=np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        quantized(f"blk.0.{name}.weight", _EMBED, _EMBED)
    quantized("blk.0.ffn_gate.weight", _FFN, _EMBED)
    quantized("blk.0.ffn_up.weight", _FFN, _EMBED)
    quantized("blk.0.ffn_down.weight", _EMBED, _FFN)
    quantized("output.weight", _VOCAB, _EMBED)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def probe_model_path() -> Path:
    """The probe model in the user cache, written (atomically) if missing."""
    folder = private_dir(cache_dir() / "probe")
    path = folder / f"amx-probe-v{PROBE_MODEL_VERSION}.gguf"
    if not path.is_file():
        fd, partial = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".partial")
        os.close(fd)
        try:
            write_probe_model(Path(partial))
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return path


def run_probe(model: Path, timeout_s: float = PROBE_TIMEOUT_S,
              child: Sequence[str] = (sys.executable, "-m", "chatapp.backends.amx_probe")
              ) -> Verdict:
    """Evaluate a batch of ``model`` in a child process (``child`` + the model's path); what
    became of the child."""
    command = [*child, str(model)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Verdict.UNKNOWN
    if result.returncode == 0 and result.stdout.strip().endswith("ok"):
        return Verdict.SAFE
    return Verdict.CRASHES if -result.returncode in KERNEL_CRASHES else Verdict.UNKNOWN


def amx_is_safe(library_dir: Path) -> bool:
    """Whether the build in ``library_dir`` runs its AMX kernels here (probed once per build)."""
    key, memory = build_key(library_dir), memory_path()
    verdict = recalled_verdict(key, memory)
    if verdict is None:
        try:
            verdict = run_probe(probe_model_path())
        except (OSError, ImportError, ValueError):
            verdict = Verdict.UNKNOWN
        remember_verdict(key, verdict, memory)
    return verdict is Verdict.SAFE


def release_tiles() -> None:
    """Execute TILERELEASE on this thread (as oneDNN does after its kernels); AMX CPUs only."""
    import ctypes
    import mmap

    code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(_TILERELEASE_RET)
    address = ctypes.addressof(ctypes.c_char.from_buffer(code))
    ctypes.CFUNCTYPE(None)(address)()


def _evaluate_batches(model: Path) -> None:
    """The child's work: load ``model`` with llama.cpp's extra buffers (AMX), decode a batch on
    this thread, release the tiles (on a CPU with AMX), decode another."""
    import llama_cpp as lib

    from chatapp.backends.amx_guard import cpu_flags

    quiet = lib.llama_log_callback(lambda *_: None)  # referenced until the process ends
    lib.llama_log_set(quiet, None)
    lib.llama_backend_init()
    loaded = lib.llama_model_load_from_file(str(model).encode(), lib.llama_model_default_params())
    if not loaded:
        raise SystemExit("the probe model did not load")
    params = lib.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_threads = 64, 32, 32, 1
    params.n_threads_batch = 1  # this thread computes: the one whose tiles are released
    ctx = lib.llama_init_from_model(loaded, params)
    batch = lib.llama_batch_init(_PROBE_BATCH, 0, 1)
    for start in (0, _PROBE_BATCH):
        for i in range(_PROBE_BATCH):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = i % _VOCAB, start + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, True
        batch.n_tokens = _PROBE_BATCH
        if lib.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        if start == 0 and "amx_tile" in cpu_flags():
            release_tiles()
    print("ok", flush=True)


if __name__ == "__main__":
    _evaluate_batches(Path(sys.argv[1]))
