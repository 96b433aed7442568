"""Fill-in-the-middle latency on a 2,000-token file, with and without the cached prefix, against a
running `specchat serve`:

    specchat serve --port 8001 [MODEL OPTIONS]
    python -m benchmarks.serve_fim http://127.0.0.1:8001/v1 [--rounds 5] [--functions 32]
        [--max-tokens 32] [--json PATH]

The file is a generated Python module of ``--functions`` small functions (32: about 2,000 tokens
with the Qwen2.5 tokenizer); the cursor is at the start of the body of its middle function, the
prompt the file before it, the suffix the file after it. Each round sends, one after the other,
greedy (temperature 0, seed 0):

- ``cold``: the file with a first line of its own (``# round N``), so that nothing but the FIM
  prefix token is cached: the whole prompt is read;
- ``same``: the same request again: everything but the last prompt token is cached;
- ``typed``: the prompt with a few more characters typed at the cursor, as an editor sends it
  while the user types: the cache holds the prompt up to the cursor, the suffix after it is read
  again (the model's FIM order is prefix, suffix, middle).

Per request it prints the prompt tokens, the server's prompt time and time to first token
(``specchat.prompt_s``, ``specchat.ttft_s``) and the client's time for the whole answer; then
the medians per kind and the ratio of each warm kind's client time to the cold one's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from chatapp.bench.api_client import TIMEOUT_S, guarded

KINDS = ("cold", "same", "typed")
TYPED = "result = "  # what the user types at the cursor before the "typed" request


def module_source(functions: int, first_line: str = "") -> tuple[str, str]:
    """A module of ``functions`` small functions (after ``first_line``), split at the start of
    the body of its middle function: (prefix, suffix)."""
    parts = [first_line + "\n" if first_line else ""]
    cursor = 0
    for i in range(functions):
        parts.append(f'def metric_{i}(values, scale={i}):\n'
                     f'    """Scale the values by {i} and average the ones above '
                     f'{i * 7 % 13}."""\n    ')
        if i == functions // 2:
            cursor = len("".join(parts))
        parts.append(f"kept = [v * scale for v in values if v * scale > {i * 7 % 13}]\n"
                     "    return sum(kept) / max(len(kept), 1)\n\n\n")
    text = "".join(parts)
    return text[:cursor], text[cursor:]


@dataclass(frozen=True)
class Row:
    """One request: its round and kind, prompt tokens, the server's prompt time and time to
    first token, the client's time for the whole answer (seconds), and the text."""

    round: int
    kind: str
    prompt_tokens: int
    prompt_s: float
    ttft_s: float
    client_s: float
    text: str


def complete(base_url: str, prompt: str, suffix: str, max_tokens: int) -> tuple[dict[str, Any],
                                                                                 float]:
    """A greedy FIM completion's whole answer from the server at ``base_url`` (".../v1"), and
    the seconds it took."""
    body = {"model": "specchat", "prompt": prompt, "suffix": suffix, "max_tokens": max_tokens,
            "temperature": 0, "seed": 0}
    request = urllib.request.Request(
        base_url.rstrip("/") + "/completions", data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json", "Authorization": "Bearer unused"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        answer = json.loads(response.read())
    return answer, time.perf_counter() - started


def run_round(base_url: str, number: int, functions: int, max_tokens: int) -> list[Row]:
    """One round's three requests (see the module docstring)."""
    prefix, suffix = module_source(functions, f"# round {number} of the FIM benchmark")
    requests = {"cold": (prefix, suffix), "same": (prefix, suffix),
                "typed": (prefix + TYPED, suffix)}
    rows = []
    for kind in KINDS:
        answer, seconds = complete(base_url, *requests[kind], max_tokens)
        figures = answer["specchat"]
        rows.append(Row(number, kind, answer["usage"]["prompt_tokens"], figures["prompt_s"],
                        figures["ttft_s"], seconds, answer["choices"][0]["text"]))
    return rows


def summary(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Per kind: the medians of the prompt time, the time to first token and the client's time,
    and the client's time over the cold one's (what an editor waits for; a reply with no token
    has no time to first token)."""
    medians = {kind: {name: statistics.median(getattr(r, name) for r in rows if r.kind == kind)
                      for name in ("prompt_s", "ttft_s", "client_s")} for kind in KINDS}
    cold = medians["cold"]["client_s"]
    for kind in KINDS:
        medians[kind]["client_ratio"] = medians[kind]["client_s"] / cold
    return medians


def report(rows: Sequence[Row], out: TextIO) -> dict[str, dict[str, float]]:
    """Print the rows and the summary; the summary."""
    print("| round | request | prompt tokens | prompt ms | TTFT ms | client ms | text |", file=out)
    print("|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        print(f"| {r.round} | {r.kind} | {r.prompt_tokens} | {r.prompt_s * 1000:.0f} | "
              f"{r.ttft_s * 1000:.0f} | {r.client_s * 1000:.0f} | {r.text.strip()[:40]!r} |",
              file=out)
    medians = summary(rows)
    print(file=out)
    for kind, values in medians.items():
        print(f"{kind}: median prompt {values['prompt_s'] * 1000:.0f} ms, TTFT "
              f"{values['ttft_s'] * 1000:.0f} ms, client {values['client_s'] * 1000:.0f} ms "
              f"({values['client_ratio']:.3f}x cold)", file=out)
    return medians


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_fim",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("base_url", help="the server's address, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--functions", type=int, default=32, help="the file's size")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also write the rows and medians here")
    args = parser.parse_args(argv)

    def measure() -> None:
        rows = [row for number in range(1, args.rounds + 1)
                for row in run_round(args.base_url, number, args.functions, args.max_tokens)]
        medians = report(rows, out)
        if args.json is not None:
            args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows],
                                             "medians": medians}, indent=1) + "\n")

    return guarded(parser.prog, measure)


if __name__ == "__main__":
    sys.exit(main())
