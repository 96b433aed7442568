"""transformers' own assisted generation (``generate(assistant_model=...)``), run as a reference
row when the bench runs on the transformers backend."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from chatapp.backends.base import Backend
from chatapp.bench.report import Run

HF_ASSISTED = "hf assisted K=4"


def _torch_model(backend: Backend) -> Any:
    """The transformers model behind ``backend`` (``TransformersBackend.torch_model``, also seen
    through the bench's ``ModelClock``); RuntimeError for a backend that has none."""
    model = getattr(backend, "torch_model", None)
    if model is None:
        raise RuntimeError(f"{backend.name}: the backend does not expose its torch model")
    return model


def hf_assisted(target: Backend, draft: Backend, prompt: list[int], max_tokens: int,
                prompt_s: float) -> Run:
    """transformers' ``generate(assistant_model=...)``, greedy, 4 assistant tokens.

    Its generation time is the whole call minus the target-only prefill time of the same prompt
    (``prompt_s``), an estimate, as ``generate`` does not report its prefill separately.
    """
    import torch

    from chatapp.engine.stats import TurnStats

    model, assistant = _torch_model(target), _torch_model(draft)
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt], device=device)
    stop = sorted(target.stop_ids)
    started = time.perf_counter()
    with torch.inference_mode():
        result = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                assistant_model=assistant, num_assistant_tokens=4,
                                do_sample=False, max_new_tokens=max_tokens,
                                eos_token_id=stop, pad_token_id=stop[0] if stop else None)
    total_s = time.perf_counter() - started
    output = [int(t) for t in result[0, len(prompt):].tolist()]
    finish = "length"
    for i, token in enumerate(output):
        if token in target.stop_ids:
            output, finish = output[:i], "stop"
            break
    stats = TurnStats(tokens=len(output), prompt_tokens=len(prompt),
                      prompt_s=min(prompt_s, total_s), total_s=total_s)
    return Run(output, stats, finish, Counter(), "4 (transformers)")
