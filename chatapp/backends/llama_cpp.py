"""A llama.cpp backend (GGUF models) on llama-cpp-python's low-level C API.

Implements ``chatapp.backends.base.Backend``. One sequence (id 0) lives in the KV cache;
``cached_tokens`` mirrors it exactly. ``evaluate`` feeds tokens in chunks of ``n_batch`` through
``llama_decode`` with the logits flag set only on the last ``n_logits`` entries, so llama.cpp
computes and stores logits for those positions only (never ``logits_all``). ``truncate`` drops
positions with ``llama_memory_seq_rm``; re-evaluating after it gives the same logits as a fresh
context (llama.cpp's arithmetic for a given batch layout is deterministic).

``llama_cpp`` is imported lazily, on the first backend created, and this module never imports
torch. The library is loaded, kept off its AMX kernels where they crash, and its logging routed
(quoted in error messages, not printed) by ``chatapp.backends.llama_runtime``; the model file is
checked first by ``chatapp.backends.gguf_file``.

Memory defaults (measured on the Qwen2.5-Coder 0.5B + 1.5B pair, n_ctx 4096): the weights are read
into memory rather than mmapped, because llama.cpp repacks quantised weights at load, and with mmap
the file pages it read stay resident next to the repacked copy (+590 MB peak RSS for the pair).
``n_batch`` (= ``n_ubatch``) 256 halves the compute buffer llama.cpp reserves, which scales with
n_ubatch x vocabulary (1.5B: 303 MiB at 512, 151 at 256, 76 at 128), at no cost to decoding.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chatapp.backends import llama_runtime, thread_memory
from chatapp.backends.base import BackendError, ModelFacts
from chatapp.backends.chat_template import TemplateMessage, Tools, render_chat, tool_literals
from chatapp.backends.context_size import auto_context, kv_bytes_per_token
from chatapp.backends.gguf_file import check_gguf_file
from chatapp.backends.machine_load import CpuSample, others_busy_cores
from chatapp.backends.memory_estimate import available_memory
from chatapp.backends.prompt_parts import ControlTokens, assemble, template_parts
from chatapp.backends.threads import AdaptiveThreads, available_cores, make_thread_choice

_SEQ = 0  # the one sequence id this backend uses


class LlamaCppBackend(ModelFacts):
    """One GGUF model and its KV cache (one sequence). Not thread-safe: one caller at a time."""

    def __init__(self, path: str | os.PathLike[str], n_ctx: int | None = 4096,
                 threads: int | None = None,
                 gpu_layers: int = 0, n_batch: int = 256, use_mmap: bool = False,
                 devices: Sequence[int] | None = None, tensor_split: Sequence[float] = (),
                 repack: bool = True) -> None:
        """Load the model; raise ``BackendError`` (saying what to do) if it cannot be loaded.

        ``n_ctx`` None: the model's trained context as far as its KV cache fits in memory
        (``chatapp.backends.context_size.auto_context``).
        ``n_batch`` is both llama.cpp's logical and physical batch size: the most tokens per
        ``llama_decode``. ``use_mmap`` trades resident memory for load time (see the module notes).
        ``threads`` fixes the CPU thread count; None adapts it to how busy the machine is
        (``AdaptiveThreads``; with GPU layers, all cores, fixed).
        ``devices`` (ggml device pointers, e.g. RPC servers' from ``chatapp.backends.rpc``) are
        the only devices the ``gpu_layers`` go to, layer split in that order, weighted by
        ``tensor_split`` (one weight per device; empty: by free memory); None: every device.
        ``repack`` False keeps llama.cpp from repacking CPU weights (its "extra" buffer types), as
        an RPC server's buffers are: then local and RPC logits are bit-identical.
        """
        if n_batch < 1 or (n_ctx is not None and n_ctx < 1):
            raise ValueError(f"n_batch and n_ctx must be positive, got {n_batch} and {n_ctx}")
        self._path = Path(path)
        check_gguf_file(self._path)
        lib = llama_runtime.lib()
        self._lib = lib
        load_started = CpuSample.now()
        self._model = self._load_model(gpu_layers, use_mmap, devices, tensor_split, repack)
        self._ctx = None
        self._batch = None
        # llama.cpp's own default is a fixed 4
        self._thread_memory = thread_memory.memory_path(self._path, available_cores())
        self.thread_choice = make_thread_choice(
            threads, available_cores(), adaptive=not gpu_layers,
            others_busy=others_busy_cores(load_started) if not threads else None,
            expected=thread_memory.recall(self._thread_memory) if not threads else None)
        self._threads_set = self.thread_choice.current
        try:
            self._ctx = self._new_context(n_ctx or self._auto_context(), n_batch,
                                          self._threads_set)
            self._n_batch = n_batch
            self._batch = lib.llama_batch_init(n_batch, 0, 1)
            self._memory = lib.llama_get_memory(self._ctx)
            self._vocab = lib.llama_model_get_vocab(self._model)
            self._vocab_size = lib.llama_vocab_n_tokens(self._vocab)
            self._n_ctx = lib.llama_n_ctx(self._ctx)
            self._fim_ids = self._find_fim_ids()
            self._stop_ids = self._find_stop_ids()
            self.quantization = self._quantization()
            self._name = f"{self._meta('general.name') or self._path.stem} ({self.quantization})"
        except BaseException:
            self.close()
            raise
        self._cache: list[int] = []
        self._fingerprint: str | None = None
        self._controls: ControlTokens | None = None
        self._piece_buf = ctypes.create_string_buffer(64)
        self.uses_fallback_template = False

    # -- loading -------------------------------------------------------------------------------

    def _model_params(self, gpu_layers: int, use_mmap: bool, repack: bool) -> Any:
        params = self._lib.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        params.use_extra_bufts = repack and llama_runtime.repacking_allowed()
        if hasattr(params, "load_mode"):  # llama.cpp replaced use_mmap with load_mode in 2026
            params.load_mode = (self._lib.LLAMA_LOAD_MODE_MMAP if use_mmap
                                else self._lib.LLAMA_LOAD_MODE_NONE)
        else:
            params.use_mmap = use_mmap
        return params

    def _load_model(self, gpu_layers: int, use_mmap: bool, devices: Sequence[int] | None,
                    tensor_split: Sequence[float], repack: bool) -> Any:
        params = self._model_params(gpu_layers, use_mmap, repack)
        if devices is not None:  # both arrays only need to live until the load returns
            device_list = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            params.devices = ctypes.cast(device_list, ctypes.c_void_p).value
            params.split_mode = self._lib.LLAMA_SPLIT_MODE_LAYER
        if tensor_split:
            split = (ctypes.c_float * self._lib.llama_max_devices())(*tensor_split)
            params.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        llama_runtime.clear_log()
        model = self._lib.llama_model_load_from_file(str(self._path).encode(), params)
        if not model:
            size = self._path.stat().st_size
            raise BackendError(
                f"llama.cpp could not load {self._path} ({size:,} bytes). The file is probably "
                "truncated or corrupt, or its architecture is newer than this llama-cpp-python: "
                "assemble or download it again and check its sha256, or upgrade llama-cpp-python."
                + llama_runtime.llama_said())
        return model

    def _new_context(self, n_ctx: int, n_batch: int, threads: int) -> Any:
        params = self._lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        llama_runtime.clear_log()
        ctx = self._lib.llama_init_from_model(self._model, params)
        if not ctx:
            raise BackendError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {self._path.name}: "
                "probably out of memory. Lower n_ctx (--n-ctx) or n_batch."
                + llama_runtime.llama_said())
        return ctx

    def _auto_context(self) -> int:
        """The window for ``n_ctx`` None (``auto_context``), from the loaded model's shape."""
        lib, model = self._lib, self._model
        per_token = kv_bytes_per_token(lib.llama_model_n_layer(model),
                                       lib.llama_model_n_head_kv(model),
                                       lib.llama_model_n_embd(model), lib.llama_model_n_head(model))
        return auto_context(lib.llama_model_n_ctx_train(model), per_token, available_memory())

    def _find_stop_ids(self) -> frozenset[int]:
        lib, vocab = self._lib, self._vocab
        ids = {lib.llama_vocab_eos(vocab), lib.llama_vocab_eot(vocab), *(self._fim_ids or ())}
        ids.update(t for t in range(self._vocab_size) if lib.llama_vocab_is_eog(vocab, t))
        return frozenset(t for t in ids if 0 <= t < self._vocab_size)

    def _find_fim_ids(self) -> tuple[int, int, int] | None:
        """The FIM prefix, suffix and middle tokens as llama.cpp's vocabulary knows them (the
        GGUF's ``tokenizer.ggml.fim_pre_token_id`` etc., else found by their text); None unless
        all three are there."""
        lib, vocab = self._lib, self._vocab
        ids = (lib.llama_vocab_fim_pre(vocab), lib.llama_vocab_fim_suf(vocab),
               lib.llama_vocab_fim_mid(vocab))
        return ids if all(0 <= t < self._vocab_size for t in ids) else None

    def _quantization(self) -> str:
        """The file's quantisation as llama.cpp names it ("Q8_0", "Q4_K - Medium")."""
        buf = ctypes.create_string_buffer(256)
        self._lib.llama_model_desc(self._model, buf, len(buf))
        words = buf.value.decode("utf-8", errors="replace").split(" ", 2)  # arch, size, type
        return words[2] if len(words) == 3 else "?"

    def _meta(self, key: str) -> str | None:
        """A string from the GGUF metadata, or None if the key is absent."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    # -- Backend protocol ----------------------------------------------------------------------

    @property
    def stop_ids(self) -> frozenset[int]:
        """EOS, EOT, every token llama.cpp marks end-of-generation (e.g. <|endoftext|>) and the
        FIM prefix, suffix and middle tokens."""
        return self._stop_ids

    @property
    def fim_ids(self) -> tuple[int, int, int] | None:
        return self._fim_ids

    @property
    def cached_tokens(self) -> Sequence[int]:
        return tuple(self._cache)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``; never adds BOS. ``special`` parses control tokens in the text."""
        self._require_open()
        data = text.encode("utf-8")
        size = len(data) + 8
        while True:
            buf = (self._lib.llama_token * size)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, size, False, special)
            if n >= 0:
                return list(buf[:n])
            size = -n

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of ``token`` (special tokens rendered as their text, no space stripped);
        b"" for an id outside the vocabulary."""
        self._require_open()
        if not 0 <= token < self._vocab_size:
            return b""  # llama.cpp aborts the process on an out-of-range id
        n = self._lib.llama_token_to_piece(self._vocab, token, self._piece_buf,
                                           len(self._piece_buf), 0, True)
        if n < 0:
            self._piece_buf = ctypes.create_string_buffer(-n)
            return self.token_bytes(token)
        return ctypes.string_at(self._piece_buf, n)

    def vocab_fingerprint(self) -> str:
        """sha256 over ``token_bytes`` of every id, each followed by a NUL byte (cached). The
        transformers backend uses the same definition, so the two backends can be paired."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for token in range(self._vocab_size):
                digest.update(self.token_bytes(token))
                digest.update(b"\0")
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def chat_prompt(self, messages: Sequence[TemplateMessage], limit: int | None = None,
                    cancel: threading.Event | None = None, tools: Tools = ()) -> list[int]:
        """Render the GGUF's ``tokenizer.chat_template`` (ChatML if absent or broken) and
        tokenize it, control tokens from the template's markup only (``assemble``: see the
        protocol for ``limit``, ``cancel`` and ``tools``). Sets ``uses_fallback_template``."""
        self._require_open()
        parts, self.uses_fallback_template = template_parts(
            lambda shown: self._render_chat(shown, tools), messages,
            tool_literals(messages, tools))
        return assemble(parts, self._control_tokens(), self.tokenize, limit, cancel)

    def _render_chat(self, messages: Sequence[TemplateMessage], tools: Tools = ()
                     ) -> tuple[str, bool]:
        return render_chat(self._meta("tokenizer.chat_template"), messages,
                           self._token_text(self._lib.llama_vocab_bos(self._vocab)),
                           self._token_text(self._lib.llama_vocab_eos(self._vocab)), tools)

    def _control_tokens(self) -> ControlTokens:
        """The tokens llama.cpp's control-token parsing finds in text (control, user-defined
        and unknown ones), by their text (cached)."""
        if self._controls is None:
            lib, vocab = self._lib, self._vocab
            kinds = (lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_USER_DEFINED
                     | lib.LLAMA_TOKEN_ATTR_UNKNOWN)
            self._controls = ControlTokens({
                self.token_bytes(t).decode("utf-8", "replace"): t
                for t in range(self._vocab_size) if lib.llama_vocab_get_attr(vocab, t) & kinds})
        return self._controls

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Append ``tokens`` to the cache; return float32 logits (n_logits, vocab_size) predicted
        after each of the last ``n_logits`` tokens. On a llama.cpp failure the cache is left as it
        was before the call and ``BackendError`` is raised."""
        self._require_open()
        tokens = list(tokens)
        if not 0 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits must be in 0..{len(tokens)}, got {n_logits}")
        start = len(self._cache)
        if start + len(tokens) > self._n_ctx:
            raise BackendError(
                f"The context window of {self._n_ctx} tokens is full ({start} cached + "
                f"{len(tokens)} new). Start a new chat or raise n_ctx (--n-ctx).")
        logits = np.empty((n_logits, self._vocab_size), dtype=np.float32)
        first_out = len(tokens) - n_logits
        row = lo = 0
        for size in self._chunk_sizes(len(tokens)):
            chunk = tokens[lo:lo + size]
            self._decode(chunk, start + lo, first_out - lo, start)
            for i in range(max(0, first_out - lo), len(chunk)):
                logits[row] = self._logits_row(i)
                row += 1
            lo += size
        return logits

    def _chunk_sizes(self, n_tokens: int) -> list[int]:
        """The thread choice's split of an evaluation (``ThreadChoice.chunks``), each part cut
        into pieces of at most ``n_batch`` tokens."""
        sizes = []
        for part in self.thread_choice.chunks(n_tokens):
            sizes += [min(self._n_batch, part - lo) for lo in range(0, part, self._n_batch)]
        return sizes

    def truncate(self, n: int) -> None:
        """Drop every cached position >= ``n`` (no-op if fewer are cached)."""
        if n < 0:
            raise ValueError(f"cannot truncate to {n} tokens")
        self._require_open()
        if n >= len(self._cache):
            return
        self._remove_from(n)
        del self._cache[n:]

    def close(self) -> None:
        """Free the batch, the context and the model (keeping what the thread counts cost in
        ``chatapp.backends.thread_memory``). Safe to call twice."""
        if isinstance(getattr(self, "thread_choice", None), AdaptiveThreads):
            thread_memory.remember(self.thread_choice.learnt(), self._thread_memory)
        lib = self._lib
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            lib.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            lib.llama_model_free(self._model)
            self._model = None

    # -- internals -----------------------------------------------------------------------------

    def _decode(self, chunk: list[int], pos: int, first_out: int, rollback_to: int) -> None:
        """Decode ``chunk`` at positions ``pos``..; entries at index >= ``first_out`` get logits.
        On failure, remove everything from ``rollback_to`` on and raise ``BackendError``."""
        batch = self._batch
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = _SEQ
            batch.logits[i] = i >= first_out
        batch.n_tokens = len(chunk)
        llama_runtime.clear_log()
        threads = self.thread_choice.choose(len(chunk))
        if threads != self._threads_set:
            self._lib.llama_set_n_threads(self._ctx, threads, threads)
            self._threads_set = threads
        started = time.perf_counter()
        status = self._lib.llama_decode(self._ctx, batch)
        self.thread_choice.observe(threads, len(chunk), time.perf_counter() - started)
        if status != 0:
            self._remove_from(rollback_to)
            del self._cache[rollback_to:]
            raise BackendError(f"llama_decode failed (status {status}) on {len(chunk)} tokens at "
                               f"position {pos} in {self._name}." + llama_runtime.llama_said())
        self._cache.extend(chunk)

    def _require_open(self) -> None:
        """Calling into a freed model would crash the process; raise instead."""
        if self._model is None:
            raise BackendError(f"The model {self._name} was closed.")

    def _logits_row(self, index: int) -> np.ndarray:
        pointer = self._lib.llama_get_logits_ith(self._ctx, index)
        if not pointer:
            raise BackendError(f"llama.cpp returned no logits for batch entry {index}.")
        return np.ctypeslib.as_array(pointer, shape=(self._vocab_size,))

    def _remove_from(self, n: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._memory, _SEQ, n, -1):
            raise BackendError(f"llama.cpp could not roll the KV cache of {self._name} back to "
                               f"{n} tokens (this model's cache cannot be partially cleared).")

    def _token_text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")
