"""`python -m benchmarks.gpu_profile`: the transformers backend measured on a GPU (or, to test
the command, on the CPU) with random-weight Qwen2.5-shaped models; no model file, no network.

- ``SHAPES``: the real Qwen2.5 0.5B, 1.5B and 7B hyperparameters, and ``tiny`` for tests. Weights
  are random, created on the device (bfloat16 on CUDA, float32 on the CPU); no stop token; the
  prompt and the verified tokens are random ids.
- All timings go through ``TransformersBackend.evaluate``/``truncate`` and
  ``SpeculativeEngine.generate``: medians of ``--repeats`` after a warm-up run, CUDA events on a
  GPU, ``time.perf_counter`` on the CPU. Per target size: verifying n = 1..``--max-n`` tokens
  after a ``--context``-token context; plain decoding; a greedy speculative reply at K = ``--k``
  whose draft (``--draft``, by default the smallest size) runs for real while
  ``SyntheticDrafter`` makes each draft token the target's greedy one with probability
  ``--accept``; host synchronisations per step (CUDA only, else null); ``predicted_speedup``.
- The speculative reply equals the plain one up to the arithmetic (batched and one-token kernels
  may round differently in bfloat16): ``same_prefix`` says for how many tokens.
- ``per_token_acceptance`` = accepted / (accepted + rejections) estimates the formula's ``a``;
  ``acceptance_rate`` (accepted / drafted) is lower at the same ``a``. ``--acceptance-json``
  predicts per category from the mean ``acceptance_rate`` of the ``auto`` rows of a ``specchat
  bench --json`` output: a cautious ``a``. Everything goes to one JSON file and a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from chatapp.backends.base import Backend
from chatapp.backends.threads import FixedThreads
from chatapp.backends.transformers_backend import TransformersBackend
from chatapp.bench.specs import RunSpec
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import MAX_DRAFT_LENGTH, MODEL_SOURCE, DraftBudget, Proposal
from chatapp.engine.events import DoneEvent, StepEvent, TokenEvent
from chatapp.engine.kv import common_prefix_length, evaluate_sequence
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams, greedy_tokens
from chatapp.engine.stats import decode_tokens_per_s
from chatapp.policy.fixed import FixedDraftLength

_QWEN = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                 tie_word_embeddings=False),
    "0.5b": dict(_QWEN, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(_QWEN, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(_QWEN, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}
TABLE_ACCEPTANCES = (0.6, 0.7, 0.8, 0.9)
TABLE_KS = tuple(range(1, 9))
WARMUP = 1  # untimed runs before each timed series
SYNC_STEPS = 4  # engine steps whose host synchronisations are counted
AUTO = RunSpec("model").name  # the bench's configuration name of the adaptive policy


def build_backend(size: str, device: torch.device, seed: int, n_ctx: int) -> TransformersBackend:
    """A random-weight model of ``SHAPES[size]`` created on ``device`` (bfloat16 on CUDA)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen2Config(**SHAPES[size], eos_token_id=None, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):  # the weights are created and initialised there, in ``dtype``
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # from_model reads token texts and stop ids from a tokenizer: one word, no stop token
    words = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"?": 0}, "?")))
    backend = TransformersBackend.from_model(model, words, n_ctx=n_ctx, name=size)
    backend.use_threads(FixedThreads(torch.get_num_threads()))
    return backend


def timed(device: torch.device, action: Callable[[], object]) -> float:
    """Seconds ``action`` takes, device work included: CUDA events on a GPU, else perf_counter."""
    if device.type != "cuda":
        started = time.perf_counter()
        action()
        return time.perf_counter() - started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    action()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def evaluation_costs(backend: Backend, device: torch.device, context: Sequence[int],
                     feed: Sequence[int], sizes: Sequence[int], repeats: int) -> dict[int, float]:
    """Per n in ``sizes``: median seconds of ``evaluate(feed[:n], n)`` after ``context``, the
    cache truncated back to the context after every run."""
    evaluate_sequence(backend, context, 0)
    costs = {}
    for n in sizes:
        times = []
        for _ in range(WARMUP + repeats):
            times.append(timed(device, lambda: backend.evaluate(feed[:n], n)))
            backend.truncate(len(context))
        costs[n] = statistics.median(times[WARMUP:])
    return costs


class SyntheticDrafter(ModelDrafter):
    """Drafts with a real model, one evaluation per token as ``ModelDrafter`` does (whose prefill,
    rollback and close it keeps), but proposes at each position the target's greedy token
    (``reference``: the target's greedy reply to ``prompt``) with probability ``accept``, else
    another token; once the reply has left the reference, the draft model's own greedy tokens."""

    def __init__(self, backend: Backend, prompt: Sequence[int], reference: Sequence[int],
                 accept: float, seed: int) -> None:
        super().__init__(backend)
        self.accept = accept
        self.prompt, self.reference = list(prompt), list(reference)
        self.rng = np.random.default_rng(seed)

    @property
    def name(self) -> str:
        return f"synthetic {self.backend.name}"

    def propose(self, context: Sequence[int], budget: DraftBudget, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        reply = list(context[len(self.prompt):])
        ahead = self.reference[len(reply):] if reply == self.reference[:len(reply)] else []
        sequence, tokens = list(context), []
        for i in range(budget.for_source(MODEL_SOURCE)):
            own = greedy_tokens(evaluate_sequence(self.backend, sequence, 1))[0]
            tokens.append(self._choose(ahead[i], own) if i < len(ahead) else own)
            sequence.append(tokens[-1])
        return Proposal.one_hot(tokens, self.backend.vocab_size, MODEL_SOURCE)

    def _choose(self, right: int, own: int) -> int:
        """``right`` with probability ``accept``; else ``own``, or the next id if it is right."""
        if self.rng.random() < self.accept:
            return right
        return own if own != right else (right + 1) % self.backend.vocab_size


@dataclass
class Reply:
    """One engine reply: its tokens, steps, statistics and generation speed (tokens/s)."""

    tokens: list[int]
    steps: list[StepEvent]
    stats: Any
    speed: float


def engine_reply(make_engine: Callable[[], SpeculativeEngine], prompt: Sequence[int],
                 tokens: int, k: int, repeats: int) -> Reply:
    """The last of ``WARMUP + repeats`` greedy replies of ``tokens`` tokens at a fixed K (0: plain
    decoding), each by a ``make_engine()``, with the median speed of the timed ones."""
    speeds = []
    for _ in range(WARMUP + repeats):
        events = list(make_engine().generate(prompt, GenerationSettings(max_tokens=tokens),
                                             np.random.default_rng(0), FixedDraftLength(k)))
        done = events[-1]
        assert isinstance(done, DoneEvent)
        speeds.append(decode_tokens_per_s(done.stats))
    return Reply([e.id for e in events if isinstance(e, TokenEvent)],
                 [e for e in events if isinstance(e, StepEvent)], done.stats,
                 statistics.median(speeds[WARMUP:]))


def per_token_acceptance(steps: Sequence[StepEvent]) -> float | None:
    """accepted / (accepted + steps that rejected a draft token); None when nothing was tested."""
    accepted = sum(step.accepted for step in steps)
    tested = accepted + sum(1 for step in steps if step.accepted < step.drafted)
    return accepted / tested if tested else None


def syncs_per_step(device: torch.device, engine: SpeculativeEngine, prompt: Sequence[int],
                   k: int) -> float | None:
    """Host synchronisations per engine step after the prompt, counted by torch's sync debug
    mode over ``SYNC_STEPS`` steps; None off CUDA."""
    if device.type != "cuda":
        return None
    room = GenerationSettings(max_tokens=(k + 1) * SYNC_STEPS + 2)  # no draft is cut short
    events = engine.generate(prompt, room, np.random.default_rng(0), FixedDraftLength(k))
    next(events)  # the PromptEvent: the prompt is evaluated
    steps = 0
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            while steps < SYNC_STEPS and not isinstance(event := next(events), DoneEvent):
                steps += isinstance(event, StepEvent)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    events.close()
    return sum("synchroniz" in str(w.message) for w in caught) / max(steps, 1)


def predicted_speedup(acceptance: float, k: int, draft_step_s: float,
                      verify_s_by_n: Mapping[int, float]) -> float:
    """Leviathan et al.'s speedup with measured costs: E * verify(1) / (K * draft + verify(K+1)),
    E = (1 - a^(K+1)) / (1 - a) the expected tokens per step at per-token acceptance ``a``.
    ``verify_s_by_n`` must hold n = 1 and n = K + 1 (else KeyError)."""
    if not 0.0 <= acceptance <= 1.0 or k < 0:
        raise ValueError(f"acceptance must be in [0, 1] and K >= 0, got {acceptance}, {k}")
    expected = k + 1.0 if acceptance == 1.0 else (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return expected * verify_s_by_n[1] / (k * draft_step_s + verify_s_by_n[k + 1])


def speedups_by_k(acceptance: float, draft_step_s: float,
                  verify_s_by_n: Mapping[int, float]) -> dict[int, float]:
    """``predicted_speedup`` at each K of ``TABLE_KS`` whose K + 1 tokens were timed."""
    return {k: predicted_speedup(acceptance, k, draft_step_s, verify_s_by_n)
            for k in TABLE_KS if k + 1 in verify_s_by_n}


def category_acceptance(bench: Mapping[str, Any]) -> dict[str, float]:
    """Per category, the mean ``acceptance_rate`` of the ``auto`` rows of a bench JSON."""
    by_category: dict[str, list[float]] = {}
    for row in bench.get("rows", []):
        if row.get("config") == AUTO:
            by_category.setdefault(row["category"], []).append(float(row["acceptance_rate"]))
    return {category: statistics.fmean(rates) for category, rates in by_category.items()}


def profile_size(target: Backend, draft: Backend, draft_step_s: float,
                 options: argparse.Namespace, device: torch.device, prompt: list[int],
                 feed: list[int]) -> dict[str, Any]:
    """Every measurement of one target size (see the module's docstring)."""
    verify = evaluation_costs(target, device, prompt, feed, range(1, options.max_n + 1),
                              options.repeats)
    plain_engine = SpeculativeEngine(target)
    plain = engine_reply(lambda: plain_engine, prompt, options.tokens, 0, options.repeats)

    def speculative_engine() -> SpeculativeEngine:
        drafter = SyntheticDrafter(draft, prompt, plain.tokens, options.accept, options.seed)
        return SpeculativeEngine(target, drafter)

    reply = engine_reply(speculative_engine, prompt, options.tokens, options.k, options.repeats)
    return {
        "verify_s": verify, "draft_step_s": draft_step_s,
        "plain": {"tokens": len(plain.tokens), "tokens_per_s": plain.speed},
        "speculative": {
            "tokens": len(reply.tokens), "tokens_per_s": reply.speed,
            "x_plain": reply.speed / plain.speed if plain.speed else 0.0,
            "per_token_acceptance": per_token_acceptance(reply.steps),
            "acceptance_rate": reply.stats.acceptance_rate,
            "tokens_per_call": reply.stats.mean_accepted_length,
            "target_calls": reply.stats.target_calls,
            "identical_to_plain": reply.tokens == plain.tokens,
            "same_prefix": common_prefix_length(reply.tokens, plain.tokens)},
        "predicted_x_plain": predicted_speedup(options.accept, options.k, draft_step_s, verify)
        if options.k + 1 in verify else None,
        "syncs_per_step": {
            "plain": syncs_per_step(device, plain_engine, prompt, 0),
            "speculative": syncs_per_step(device, speculative_engine(), prompt, options.k)},
        "predicted_speedup": {a: speedups_by_k(a, draft_step_s, verify)
                              for a in TABLE_ACCEPTANCES},
        "category_speedup": {c: {"acceptance": a,
                                 "speedup_by_k": speedups_by_k(a, draft_step_s, verify)}
                             for c, a in options.categories.items()},
    }


def profile(options: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Build the draft, then each target size in turn (freed after it), and measure them."""
    n_ctx = options.context + options.max_n + options.tokens + options.k + 8
    draft = build_backend(options.draft, device, options.seed + 1, n_ctx)
    rng = np.random.default_rng(options.seed)
    prompt = rng.integers(0, draft.vocab_size, options.context).tolist()
    feed = rng.integers(0, draft.vocab_size, options.max_n).tolist()
    step_s = evaluation_costs(draft, device, prompt, feed, [1], options.repeats)[1]
    results: dict[str, Any] = {"draft": {"size": options.draft, "step_s": step_s}}
    for size in options.sizes:  # on an error, the frame's end frees the models
        target = build_backend(size, device, options.seed, n_ctx)
        results[size] = {"parameters": sum(p.numel() for p in target.torch_model.parameters()),
                         **profile_size(target, draft, step_s, options, device, prompt, feed)}
        target.close()  # before the next size is built
    draft.close()
    return results


def meta(options: argparse.Namespace, device: torch.device, argv: Sequence[str]) -> dict[str, Any]:
    """What the JSON says about the run itself."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": "bfloat16" if device.type == "cuda" else "float32",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "benchmarks.gpu_profile", *argv]),
        **{key: getattr(options, key) for key in ("context", "max_n", "k", "accept", "tokens",
                                                  "repeats", "seed", "categories")}}


def print_report(out: TextIO, report: dict[str, Any]) -> None:
    """The readable tables: per size, the verification costs by n, then the predictions."""
    m, draft, sizes = report["meta"], report["draft"], report["sizes"]
    print(f"{m['device']}, {m['dtype']}, torch {m['torch']}: {m['context']}-token context, draft "
          f"{draft['size']} at {draft['step_s'] * 1e3:.2f} ms/token, K = {m['k']}, accept "
          f"{m['accept']:g}, {m['tokens']} tokens, medians of {m['repeats']}", file=out)
    print(f"{'size':>5} {'params':>9} {'plain tok/s':>11} {'spec tok/s':>10} {'x plain':>7} "
          f"{'predicted':>9} {'a':>5} {'tok/call':>8} {'same':>9} {'syncs/step':>11}", file=out)
    for size, r in sizes.items():
        s, syncs = r["speculative"], r["syncs_per_step"]
        cells = [_cell(value, ".2f") for value in (r["predicted_x_plain"],
                                                    s["per_token_acceptance"])]
        cells += [_cell(syncs[kind], ".1f") for kind in ("plain", "speculative")]
        print(f"{size:>5} {r['parameters'] / 1e6:8.1f}M {r['plain']['tokens_per_s']:11.1f} "
              f"{s['tokens_per_s']:10.1f} {s['x_plain']:7.2f} {cells[0]:>9} {cells[1]:>5} "
              f"{s['tokens_per_call']:8.2f} {s['same_prefix']:>4}/{s['tokens']:<4} "
              f"{cells[2]:>5}/{cells[3]:<5}", file=out)
    print("\nverify ms by n " + " ".join(f"{size:>8}" for size in sizes), file=out)
    for n in range(1, m["max_n"] + 1):
        print(f"{n:>14} " + " ".join(f"{r['verify_s'][n] * 1e3:8.2f}" for r in sizes.values()),
              file=out)
    for size, r in sizes.items():
        rows = {f"a = {a}": by_k for a, by_k in r["predicted_speedup"].items()} | {
            f"{c} ({v['acceptance']:.2f})": v["speedup_by_k"]
            for c, v in r["category_speedup"].items()}
        print(f"\n{size}, predicted x plain:{'':>11}" + " ".join(
            f"K={k:<4}" for k in next(iter(rows.values()))), file=out)
        for label, by_k in rows.items():
            print(f"{label:>30} " + " ".join(f"{x:6.2f}" for x in by_k.values()), file=out)


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default="0.5b,1.5b,7b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--draft", help="the draft's size (default: the smallest listed)")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-n", type=int, default=32, help="verify n = 1..MAX_N tokens")
    parser.add_argument("--k", type=int, default=4, help="draft length of the speculative reply")
    parser.add_argument("--accept", type=float, default=0.8, help="synthetic acceptance")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--repeats", type=int, default=5, help="timings per median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("gpu_profile.json"))
    parser.add_argument("--acceptance-json", type=Path,
                        help="a `specchat bench --json` output: predict per category")
    options = parser.parse_args(argv)
    options.sizes = [s.strip() for s in options.sizes.split(",") if s.strip()]
    named = {*options.sizes, *([options.draft] if options.draft else [])}
    if not options.sizes or not named <= set(SHAPES) or ("tiny" in named and len(named) > 1):
        parser.error(f"sizes and draft: of {', '.join(SHAPES)}; tiny (a vocabulary of its own) "
                     "only alone")
    options.draft = options.draft or min(options.sizes, key=list(SHAPES).index)
    if not (1 <= options.k <= MAX_DRAFT_LENGTH and 0.0 <= options.accept <= 1.0
            and min(options.max_n, options.tokens, options.repeats, options.context - 1) >= 1):
        parser.error(f"need 1 <= K <= {MAX_DRAFT_LENGTH}, 0 <= accept <= 1, max-n, tokens and "
                     "repeats >= 1, context >= 2")
    options.categories = category_acceptance(json.loads(options.acceptance_json.read_text(
        encoding="utf-8"))) if options.acceptance_json else {}
    return options


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Profile, write the JSON, print the table; 2 when CUDA is asked for but absent."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options, out = parse_args(argv), out or sys.stdout
    device = torch.device(options.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch sees no CUDA GPU here; pass --device cpu (with --sizes tiny).", file=out)
        return 2
    results = profile(options, device)
    report = {"meta": meta(options, device, argv), "draft": results.pop("draft"),
              "sizes": results}
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print_report(out, report)
    print(f"Wrote {options.json}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
