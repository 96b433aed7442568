"""The context window chosen for ``n_ctx = "auto"``: the model's trained context, as far as its KV
cache fits in memory with room.

The KV cache of a llama.cpp model costs, per token, its keys and values in every layer: 2 x
layers x KV heads x head size x 2 bytes (f16). The Qwen2.5-Coder 1.5B target: 2 x 28 x 2 x 128 x 2
= 28 KiB a token, so its trained 32,768 tokens take 0.9 GiB; the 0.5B draft (24 layers, 64-wide
heads) 12 KiB a token. "With room": the target's cache may take at most ``KV_SHARE`` of the memory
available when it loads (the draft's, at most as large a window, takes less), so the two caches
together stay under half of it and the weights, the compute buffers and the rest of the machine
keep the other half.
"""

from __future__ import annotations

KV_SHARE = 0.25  # the share of the available memory the target's KV cache may take
CONTEXT_STEP = 1024  # an automatic window is a multiple of this many tokens
MIN_AUTO_CONTEXT = 4096  # the smallest automatic window (unless the model trained on less)
F16_BYTES = 2


def kv_bytes_per_token(layers: int, kv_heads: int, embedding: int, heads: int) -> int:
    """The bytes one token's keys and values take in an f16 KV cache (see the module
    docstring)."""
    return 2 * layers * kv_heads * (embedding // max(heads, 1)) * F16_BYTES


def auto_context(trained: int, per_token: int, available: int | None) -> int:
    """The window for ``n_ctx = "auto"``: ``trained`` (the model's training context), cut to the
    largest multiple of ``CONTEXT_STEP`` whose KV cache (``per_token`` bytes a token) takes at
    most ``KV_SHARE`` of ``available`` bytes (None: unknown, no cut), but not below
    ``MIN_AUTO_CONTEXT`` unless the model trained on fewer tokens."""
    if trained <= 0:  # a model that does not say: the old default
        trained = MIN_AUTO_CONTEXT
    if available is None or per_token <= 0:
        return trained
    fits = int(available * KV_SHARE) // per_token // CONTEXT_STEP * CONTEXT_STEP
    return min(trained, max(fits, MIN_AUTO_CONTEXT))
