"""Tiny random Hugging Face models built here (no downloads, no model files), for the tests of the
transformers backend and of the bench on it.

The models are Qwen2/Llama configs with hidden size 32 and 2 layers; the tokenizer is a byte-level
BPE (256 byte symbols, 3 merges, 3 control tokens) so token bytes and UTF-8 splitting are real. A
large ``initializer_range`` makes the random models' distributions peaked, so greedy decoding has
clear argmaxes and sampled sequences concentrate on a few hundred pairs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from chatapp.backends.transformers_backend import TransformersBackend
from chatapp.engine.events import StepEvent, TokenEvent
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.fixed import FixedDraftLength

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
MODEL_VOCAB = 288  # wider than the tokenizer (262), as Qwen's logits are
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPT = [83, 257, 220, 81, 82, 68, 68, 67, 198]  # "the speed\n" in the tiny vocabulary


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


def sequence(length: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 262, size=length)]


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


def torch_threads(count: int) -> Iterator[None]:
    """For a module fixture: torch on ``count`` threads meanwhile (tiny models run several times
    faster on one thread than on contended cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    yield
    torch.set_num_threads(before)
