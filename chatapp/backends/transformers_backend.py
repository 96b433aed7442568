"""The transformers (PyTorch) backend: an HF causal LM with a ``DynamicCache`` as the KV cache.

Contracts (beyond the ``Backend`` protocol in ``chatapp.backends.base``):

- ``source`` is a Hugging Face model folder (config.json + *.safetensors + tokenizer files) or a
  ``.gguf`` file. A GGUF is read once by transformers (every weight dequantised to float32) and
  saved as safetensors plus its tokenizer into ``<cache root>/hf/<key>/``, where ``key`` is the
  sha256 of the file's first MiB and its size. The folder is written under a temporary name and
  renamed, so a folder that exists is complete. Later loads read the folder (fast). The cache
  root is ``platformdirs.user_cache_dir("specchat")`` unless ``cache_dir`` is given. Folders
  specchat creates there are 0700 and the files it writes 0600 (``chatapp.user_files.private_dir``).
- Nothing is downloaded, no remote code runs and no pickled weights are read: every load is
  ``local_files_only=True``, ``trust_remote_code=False``, ``use_safetensors=True``.
- Device and dtype are chosen at run time: ``"auto"`` is CUDA with bfloat16 when
  ``torch.cuda.is_available()``, else the CPU with float32.
- ``vocab_size`` is the width of the logits (the config's ``vocab_size``), which may exceed the
  tokenizer's size; ids the tokenizer does not know have ``token_bytes`` b"".
- If a forward fails part-way, the KV cache is emptied (``cached_tokens`` becomes empty), so the
  cache never holds positions that ``cached_tokens`` does not describe.
- Load failures raise ``BackendError`` with a message that says what to fix.

Importing this module imports torch and transformers; import it only when this backend is used.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatapp.offline import stay_offline

stay_offline()  # before transformers reads the environment: never go online

import jinja2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from chatapp import user_files  # noqa: E402
from chatapp.backends.base import BackendError, ModelFacts  # noqa: E402
from chatapp.backends.chat_template import (  # noqa: E402
    TemplateMessage,
    Tools,
    render_chat,
    shows_tools,
    template_message,
    tool_literals,
)  # noqa: E402
from chatapp.backends.context_size import MIN_AUTO_CONTEXT  # noqa: E402
from chatapp.backends.gguf_file import is_gguf  # noqa: E402
from chatapp.backends.hf_vocab import fim_ids, stop_ids, token_pieces  # noqa: E402
from chatapp.backends.prompt_parts import ControlTokens, assemble, template_parts  # noqa: E402
from chatapp.backends.threads import make_thread_choice  # noqa: E402

_KEY_PREFIX_BYTES = 1 << 20
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}
_SAFE_LOAD = {"local_files_only": True, "trust_remote_code": False}

hf_logging.disable_progress_bar()  # loading progress goes through specchat's own callback


class TransformersBackend(ModelFacts):
    """One HF causal LM, its tokenizer and its KV cache. Not thread-safe."""

    def __init__(self, source: str | os.PathLike[str], *, device: str = "auto",
                 dtype: str = "auto", n_ctx: int | None = 4096, threads: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        """``n_ctx`` None: the model's own maximum (``max_position_embeddings``; its cache grows
        with the conversation). ``threads`` fixes torch's CPU thread count (process-wide, set
        before each forward); None adapts it on the CPU to how busy the machine is
        (``AdaptiveThreads``)."""
        path = Path(source).expanduser()
        target_device = resolve_device(device)
        target_dtype = resolve_dtype(dtype, target_device)
        cache_root = Path(cache_dir) if cache_dir is not None else default_cache_root()
        self.weights_dir, model, tokenizer = _load(path, cache_root, target_device, target_dtype)
        self._attach(model, tokenizer, name=path.stem if path.is_file() else path.name,
                     n_ctx=n_ctx, threads=threads)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, n_ctx: int | None = 4096,
                   name: str = "model") -> TransformersBackend:
        """Wrap an already constructed (model, tokenizer) pair; the model stays on its device."""
        backend = cls.__new__(cls)
        backend.weights_dir = None
        backend._attach(model, tokenizer, name=name, n_ctx=n_ctx)
        return backend

    def _attach(self, model: Any, tokenizer: Any, *, name: str, n_ctx: int | None,
                threads: int | None = None) -> None:
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._name = name
        self._device = next(model.parameters()).device
        self.thread_choice = make_thread_choice(threads, torch.get_num_threads(),
                                                adaptive=self._device.type == "cpu")
        self._vocab_size = int(model.config.get_text_config().vocab_size)
        max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if n_ctx is None:
            n_ctx = max_positions or MIN_AUTO_CONTEXT
        self._n_ctx = min(n_ctx, max_positions) if max_positions else n_ctx
        self._pieces = token_pieces(tokenizer, self._vocab_size)
        self._stop_ids = stop_ids(model, tokenizer, self._vocab_size)
        self._fim_ids = fim_ids(tokenizer, self._vocab_size)
        parameters = inspect.signature(model.forward).parameters
        # transformers 5.x renamed past_key_values to cache; older versions only know the former.
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters
        self._cache = self._new_cache()
        self._tokens: list[int] = []
        self._fingerprint: str | None = None
        self.uses_fallback_template = False

    # -- the Backend protocol ------------------------------------------------------------------

    @property
    def stop_ids(self) -> frozenset[int]:
        """EOS ids of the generation config, the config and the tokenizer, plus end-of-turn
        tokens (<|im_end|>, <|endoftext|>, <|eot_id|>) present in the vocabulary."""
        return self._stop_ids

    @property
    def fim_ids(self) -> tuple[int, int, int] | None:
        return self._fim_ids

    @property
    def cached_tokens(self) -> Sequence[int]:
        return tuple(self._tokens)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``; never adds BOS. ``special`` parses control tokens in the text."""
        return list(self._live_tokenizer().encode(text, add_special_tokens=False,
                                                  split_special_tokens=not special))

    def token_bytes(self, token: int) -> bytes:
        """Raw bytes of ``token``; b"" for ids outside the tokenizer (or outside the vocabulary)."""
        return self._pieces[token] if 0 <= token < self._vocab_size else b""

    def vocab_fingerprint(self) -> str:
        """sha256 over ``token_bytes`` of every id < vocab_size, each followed by a NUL byte."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for piece in self._pieces:
                digest.update(piece)
                digest.update(b"\0")
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def chat_prompt(self, messages: Sequence[TemplateMessage], limit: int | None = None,
                    cancel: threading.Event | None = None, tools: Tools = ()) -> list[int]:
        """The tokenizer's chat template with the generation prompt, tokenized with control tokens
        from the template's markup only (``assemble``: see the protocol for ``limit`` and
        ``cancel``). Without a template (or if it fails) ChatML is used and
        ``uses_fallback_template`` is set. ``tools``: as the protocol says."""
        parts, self.uses_fallback_template = template_parts(
            lambda shown: self._render_chat(shown, tools), messages,
            tool_literals(messages, tools))
        return assemble(parts, self._control_tokens(), self.tokenize, limit, cancel)

    def _control_tokens(self) -> ControlTokens:
        """The tokenizer's special added tokens, by their text."""
        decoder = self._live_tokenizer().added_tokens_decoder
        return ControlTokens({added.content: token for token, added in decoder.items()
                              if added.special})

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Append ``tokens`` to the cache; return float32 logits (n_logits, vocab_size) predicted
        after each of the last ``n_logits`` of them. The LM head runs on those positions only."""
        tokens = [int(t) for t in tokens]
        self._check_evaluate(tokens, n_logits)
        if not tokens:
            return np.zeros((0, self._vocab_size), dtype=np.float32)
        try:
            logits = self._forward(tokens, n_logits)
        except BaseException:
            self._reset_cache()  # some layers may hold the new positions and others not
            raise
        self._tokens.extend(tokens)
        return logits

    def truncate(self, n: int) -> None:
        """Drop every cached position >= ``n``."""
        if n < 0:
            raise ValueError(f"truncate length must be >= 0, got {n}")
        if n >= len(self._tokens):
            return
        if n == 0:
            self._reset_cache()
            return
        with torch.inference_mode():
            self._cache.crop(n - len(self._tokens))  # a negative count removes that many tokens
        del self._tokens[n:]

    @property
    def torch_model(self) -> Any:
        """The loaded transformers model (a ``PreTrainedModel`` in eval mode), for callers that
        drive transformers itself, such as the bench's assisted-generation reference. Calls on it
        bypass this backend's KV cache. Raises ``BackendError`` once the backend is closed."""
        return self._live_model()

    def close(self) -> None:
        """Release the model, the tokenizer and the cache. Safe to call twice."""
        if self._model is None:
            return
        on_cuda = self._device.type == "cuda"
        self._model = self._tokenizer = self._cache = None
        self._tokens.clear()
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()

    # -- internals -----------------------------------------------------------------------------

    def _live_model(self) -> Any:
        if self._model is None:
            raise BackendError(f"The model '{self._name}' was closed; load it again.")
        return self._model

    def _live_tokenizer(self) -> Any:
        self._live_model()
        return self._tokenizer

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self._live_model().config)

    def _reset_cache(self) -> None:
        self._cache = self._new_cache()
        self._tokens.clear()

    def _check_evaluate(self, tokens: list[int], n_logits: int) -> None:
        self._live_model()
        if not 0 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits must be in [0, {len(tokens)}], got {n_logits}")
        if len(self._tokens) + len(tokens) > self._n_ctx:
            raise BackendError(
                f"Context overflow: {len(self._tokens)} cached + {len(tokens)} new tokens exceed "
                f"n_ctx {self._n_ctx} of '{self._name}'. Shorten the chat or raise n_ctx.")
        bad = [t for t in tokens if not 0 <= t < self._vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self._vocab_size}): {bad[:5]}")

    def _forward(self, tokens: list[int], n_logits: int) -> np.ndarray:
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self._device)
        kwargs: dict[str, Any] = {self._cache_arg: self._cache, "use_cache": True}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = max(n_logits, 1)  # 0 would mean "every position"
        threads = self.thread_choice.choose(len(tokens))
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        started = time.perf_counter()
        with torch.inference_mode():
            logits = self._model(input_ids=input_ids, **kwargs).logits[0]
            rows = logits[logits.shape[0] - n_logits:]
            result = rows.to(device="cpu", dtype=torch.float32).numpy()
        self.thread_choice.observe(threads, len(tokens), time.perf_counter() - started)
        return result

    def _render_chat(self, messages: Sequence[TemplateMessage], tools: Tools = ()
                     ) -> tuple[str, bool]:
        tokenizer = self._live_tokenizer()
        if tokenizer.chat_template:
            conversation = [template_message(m) for m in messages]
            try:
                text = tokenizer.apply_chat_template(conversation, tools=list(tools) or None,
                                                     add_generation_prompt=True, tokenize=False)
            except (jinja2.TemplateError, ValueError, TypeError, LookupError):
                pass  # a template that raises gets the same ChatML fallback as in llama.cpp
            else:
                return shows_tools(text, tools), False
        return render_chat(None, messages, tokenizer.bos_token or "", tokenizer.eos_token or "",
                           tools)


# -- devices and dtypes --------------------------------------------------------------------------

def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else the CPU; anything else must exist here."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise BackendError(f"Unknown device '{device}'; use auto, cpu or cuda[:N].") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"Device '{device}' asked for, but torch sees no CUDA GPU; use "
                           "--device cpu (or auto), or install a CUDA build of torch.")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``"auto"`` is bfloat16 on CUDA and float32 elsewhere; or one of float32/bfloat16/float16."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise BackendError(f"Unknown dtype '{dtype}'; use auto, float32, bfloat16 or float16."
                           ) from None


# -- loading -------------------------------------------------------------------------------------

def default_cache_root() -> Path:
    return user_files.cache_dir()


def gguf_cache_key(gguf: Path) -> str:
    """sha256 of the file's first MiB followed by its size in decimal."""
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        digest.update(f.read(_KEY_PREFIX_BYTES))
    digest.update(str(gguf.stat().st_size).encode())
    return digest.hexdigest()


def _load(path: Path, cache_root: Path, device: torch.device, dtype: torch.dtype
          ) -> tuple[Path, Any, Any]:
    """Returns (the safetensors folder the weights come from, model, tokenizer)."""
    if not path.exists():
        raise BackendError(f"Model not found: {path}. Pass a Hugging Face model folder "
                           "(config.json + *.safetensors) or a .gguf file.")
    if path.is_dir():
        return path, *_load_hf_dir(path, device, dtype)
    if not is_gguf(path):
        raise BackendError(f"{path} is neither a .gguf file (no GGUF header) nor a model folder. "
                           "Pass a Hugging Face model folder or a .gguf file.")
    converted = cache_root / "hf" / gguf_cache_key(path)
    if converted.is_dir():
        return converted, *_load_hf_dir(converted, device, dtype)
    model, tokenizer = _convert_gguf(path, converted)
    return converted, model.to(device=device, dtype=dtype), tokenizer


def _load_hf_dir(folder: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    if not (folder / "config.json").is_file():
        raise BackendError(f"{folder} is not a Hugging Face model folder (no config.json). Pass a "
                           "folder with config.json, *.safetensors and the tokenizer files, or a "
                           ".gguf file.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **_SAFE_LOAD)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device),
                                                     use_safetensors=True, **_SAFE_LOAD)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... here
        raise BackendError(
            f"Could not load the model in {folder}: {exc}. The folder needs config.json, "
            "*.safetensors weights (pickled .bin weights are refused) and tokenizer files; if "
            "it is a cache folder of a converted GGUF, delete it to convert again.") from exc
    return model, tokenizer


def _convert_gguf(gguf: Path, destination: Path) -> tuple[Any, Any]:
    """Dequantise ``gguf`` to a float32 CPU model, save it (safetensors + tokenizer) atomically
    to ``destination`` and return (model, tokenizer)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, **_SAFE_LOAD)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32, **_SAFE_LOAD,
                                                     **_dequantize_kwargs())
    except Exception as exc:  # the GGUF reader raises anything from ValueError to struct.error
        raise BackendError(
            f"Could not read the GGUF file {gguf}: {exc}. It may be truncated or corrupt (check "
            "its size and sha256), or its architecture is not supported by transformers; the "
            "llama.cpp backend may load it.") from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense; drop the marker that blocks saving
        quantizer.remove_quantization_config(model)
    _save_atomically(model, tokenizer, destination)
    return model, tokenizer


def _dequantize_kwargs() -> dict[str, Any]:
    """Ask transformers >= 5 to unpack every GGUF weight (older versions always do)."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _save_atomically(model: Any, tokenizer: Any, destination: Path) -> None:
    user_files.private_dir(destination.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        user_files.make_tree_private(staging)
        staging.rename(destination)
    except OSError as exc:
        if not destination.is_dir():  # else another process finished the same conversion first
            raise BackendError(f"Could not write the converted model to {destination}: {exc}. "
                               "Free disk space (a float32 copy is about 4 bytes per "
                               "parameter) or pass another cache directory.") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
