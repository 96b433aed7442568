"""What the API costs: the same bench prompts through `specchat run --json` and through a streamed
request to `specchat serve`, with the same settings, side by side:

    python -m benchmarks.serve_overhead [--prompts 4] [--max-tokens 128] [--repeats 3]
        [--run-args "MODEL OPTIONS"] [--json PATH]

``--run-args`` (e.g. ``"-k 4 --drafter ngram"``) go to both commands, after the settings both get:
greedy (``--temperature 0 --seed 0``) and ``--max-tokens``. Both run as subprocesses of this
Python (``python -m chatapp.cli run|serve``), one at a time, never side by side.

The server keeps an in-memory suffix index over what it served and has no option to turn it off:
a prompt sent twice to one server (or a prompt after another one's reply) could draft from an
earlier reply, which `specchat run` never can. So the tool starts a fresh server for every
request (loading is not timed) and stops it after the reply. For each prompt, ``--repeats`` times,
it runs `specchat run` and the server's request in turn (the order swapped every other repeat).

Compared, per pair and as means over all pairs:

- decode speed (prompt processing excluded) from the engine's own figures on both sides (run's
  ``done`` statistics; the server's ``specchat.decode_tokens_per_s``), and the rate at which the
  streamed tokens after the first chunk reached the client; the ratios to run's speed, with their
  geometric mean (target: at least 0.97x);
- time to first token: run's engine figure against the server's engine figure and the time the
  client waited for the first text chunk (target: within 50 ms of run's);
- whether the replies were equal, from prompts of as many tokens (they must be: the same prompt
  through the same chat template, the same greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from chatapp.bench.api_client import Streamed, guarded, request_body, stream_completion
from chatapp.bench.report import geometric_mean
from chatapp.bench.serve_process import ServeProcess
from chatapp.bench.specs import BenchPrompt, load_prompts, select_prompts

CLI = [sys.executable, "-m", "chatapp.cli"]
DECODE_TARGET = 0.97  # the server's decode speed, at least this share of run's
TTFT_TARGET_S = 0.050  # the client's time to first token, at most this much over run's


@dataclass(frozen=True)
class Pair:
    """One prompt through both paths: tokens, decode tok/s, times to first token (s), and
    whether both gave the same reply to prompts of as many tokens."""

    prompt: str
    repeat: int
    tokens: int
    run_tokens_per_s: float
    serve_tokens_per_s: float
    client_tokens_per_s: float
    run_ttft_s: float
    serve_ttft_s: float
    client_ttft_s: float
    same_reply: bool


@dataclass(frozen=True)
class Commands:
    """The two commands, each without the prompt and the settings (tests give fakes)."""

    run: Sequence[str] = (*CLI, "run")
    serve: Sequence[str] = (*CLI, "serve")


def settings_args(max_tokens: int, run_args: Sequence[str]) -> list[str]:
    """The options both commands get: greedy, seed 0, ``max_tokens``, then ``run_args``."""
    return ["--temperature", "0", "--seed", "0", "--max-tokens", str(max_tokens), *run_args]


def run_once(command: Sequence[str], settings: Sequence[str],
             prompt: str) -> tuple[str, dict[str, Any]]:
    """`specchat run --json` on ``prompt``: its reply and its ``done`` statistics."""
    done = subprocess.run([*command, "--json", *settings, prompt], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ends = [event["stats"] for event in events if event.get("type") == "done"]
    if done.returncode != 0 or not ends:
        raise ValueError(f"`{shlex.join([*command, '--json', *settings])}` failed "
                         f"({done.returncode}): {done.stderr.strip()[-2000:]}")
    text = "".join(event["text"] for event in events if event.get("type") == "token")
    return text, ends[-1]


def measure_pair(commands: Commands, settings: Sequence[str], prompt: BenchPrompt,
                 max_tokens: int, repeat: int) -> Pair:
    """``prompt`` through `specchat run` and a fresh server (in turn; server first on odd
    ``repeat``s)."""
    def run_side() -> tuple[str, dict[str, Any]]:
        return run_once(commands.run, settings, prompt.text)

    def serve_side() -> Streamed:
        with ServeProcess([*commands.serve, *settings]) as server:
            body = request_body([{"role": "user", "content": prompt.text}], max_tokens)
            return stream_completion(server.base_url, body)

    if repeat % 2:
        streamed = serve_side()
        text, stats = run_side()
    else:
        text, stats = run_side()
        streamed = serve_side()
    decode_s = stats["total_s"] - stats["prompt_s"]
    return Pair(prompt.id, repeat, stats["tokens"],
                stats["tokens"] / decode_s if decode_s > 0 else 0.0,
                streamed.figures.get("decode_tokens_per_s", 0.0), streamed.client_tokens_per_s,
                stats["ttft_s"], streamed.figures.get("ttft_s", 0.0), streamed.client_ttft_s,
                text == streamed.text
                and stats["prompt_tokens"] == streamed.usage.get("prompt_tokens"))


def _ratio(value: float, base: float) -> float:
    return value / base if base > 0 else 0.0


def summary(pairs: Sequence[Pair]) -> dict[str, Any]:
    """Geometric means of the speeds and of their ratios to run's, the mean times to first
    token and their differences to run's (s), and whether the targets were met."""
    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    engine = geometric_mean([_ratio(p.serve_tokens_per_s, p.run_tokens_per_s) for p in pairs])
    client = geometric_mean([_ratio(p.client_tokens_per_s, p.run_tokens_per_s) for p in pairs])
    late = [p.client_ttft_s - p.run_ttft_s for p in pairs]
    return {
        "pairs": len(pairs),
        "run_tokens_per_s": geometric_mean([p.run_tokens_per_s for p in pairs]),
        "serve_tokens_per_s": geometric_mean([p.serve_tokens_per_s for p in pairs]),
        "client_tokens_per_s": geometric_mean([p.client_tokens_per_s for p in pairs]),
        "serve_ratio": engine, "client_ratio": client,
        "run_ttft_s": mean([p.run_ttft_s for p in pairs]),
        "serve_ttft_s": mean([p.serve_ttft_s for p in pairs]),
        "client_ttft_s": mean([p.client_ttft_s for p in pairs]),
        "serve_minus_run_ttft_s": mean([p.serve_ttft_s - p.run_ttft_s for p in pairs]),
        "client_minus_run_ttft_s": mean(late), "client_minus_run_ttft_max_s": max(late),
        "decode_target_met": engine >= DECODE_TARGET,
        "ttft_target_met": mean(late) <= TTFT_TARGET_S,
        "same_replies": all(p.same_reply for p in pairs),
    }


def print_row(pair: Pair, out: TextIO) -> None:
    ms = 1000.0
    served = _ratio(pair.serve_tokens_per_s, pair.run_tokens_per_s)
    seen = _ratio(pair.client_tokens_per_s, pair.run_tokens_per_s)
    print(f"| {pair.prompt} | {pair.repeat + 1} | {pair.tokens} | {pair.run_tokens_per_s:.2f} | "
          f"{pair.serve_tokens_per_s:.2f} ({served:.3f}x) | "
          f"{pair.client_tokens_per_s:.2f} ({seen:.3f}x) | "
          f"{pair.run_ttft_s * ms:.0f} | {pair.serve_ttft_s * ms:.0f} | "
          f"{pair.client_ttft_s * ms:.0f} ({(pair.client_ttft_s - pair.run_ttft_s) * ms:+.0f}) | "
          f"{'yes' if pair.same_reply else 'NO'} |", file=out, flush=True)


def print_summary(result: dict[str, Any], out: TextIO) -> None:
    ms = 1000.0
    print(f"\nGeometric means over {result['pairs']} pairs: decode tok/s run "
          f"{result['run_tokens_per_s']:.2f}, server {result['serve_tokens_per_s']:.2f} "
          f"({result['serve_ratio']:.3f}x, target at least {DECODE_TARGET}x: "
          f"{'met' if result['decode_target_met'] else 'NOT met'}), as the client saw the "
          f"stream {result['client_tokens_per_s']:.2f} ({result['client_ratio']:.3f}x).", file=out)
    print(f"Mean time to first token: run {result['run_ttft_s'] * ms:.0f} ms, server "
          f"{result['serve_ttft_s'] * ms:.0f} ms ({result['serve_minus_run_ttft_s'] * ms:+.0f}), "
          f"client {result['client_ttft_s'] * ms:.0f} ms "
          f"({result['client_minus_run_ttft_s'] * ms:+.0f}, at most "
          f"{result['client_minus_run_ttft_max_s'] * ms:+.0f}; target within "
          f"{TTFT_TARGET_S * ms:.0f} ms: {'met' if result['ttft_target_met'] else 'NOT met'}). "
          f"Replies {'all equal' if result['same_replies'] else 'NOT all equal'}.", file=out)


def measure(prompts: Sequence[BenchPrompt], max_tokens: int, repeats: int,
            run_args: Sequence[str], out: TextIO,
            commands: Commands = Commands()) -> dict[str, Any]:
    """Every prompt ``repeats`` times both ways, a Markdown table and the summary on ``out``;
    the pairs and the summary (as JSON data)."""
    settings = settings_args(max_tokens, run_args)
    print("| prompt | repeat | tokens | run tok/s | server tok/s | client tok/s | run TTFT ms | "
          "server TTFT ms | client TTFT ms (- run) | same reply |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    pairs = []
    for repeat in range(repeats):
        for prompt in prompts:
            pairs.append(measure_pair(commands, settings, prompt, max_tokens, repeat))
            print_row(pairs[-1], out)
    result = summary(pairs)
    print_summary(result, out)
    return {"settings": settings, "pairs": [asdict(pair) for pair in pairs], "summary": result}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="4",
                        help="a count (the first N bench prompts), or ids or categories")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-args", default="", help="model options for both commands, "
                        "quoted as one argument (e.g. \"-k 4 --target qwen2.5-coder-1.5b\")")
    parser.add_argument("--json", dest="json_path", type=Path, help="also write results here")
    args = parser.parse_args(argv)

    def measure_all() -> None:
        if args.repeats < 1 or args.max_tokens < 1:
            raise ValueError("--repeats and --max-tokens must be at least 1")
        prompts = select_prompts(load_prompts(), args.prompts)
        result = measure(prompts, args.max_tokens, args.repeats, shlex.split(args.run_args),
                         sys.stdout)
        if args.json_path is not None:
            args.json_path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

    return guarded("serve_overhead", measure_all)


if __name__ == "__main__":
    sys.exit(main())
