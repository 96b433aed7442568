"""A coding agent repeats itself: a scripted agent session sent to two `specchat serve` servers,
one with the default drafter (and its in-memory suffix index over what it served), one
target-only, request by request:

    specchat serve --port 8001 --n-ctx 8192 [MODEL OPTIONS]
    specchat serve --port 8002 --n-ctx 8192 -k 0 [MODEL OPTIONS]
    python -m benchmarks.serve_agent http://127.0.0.1:8001/v1 http://127.0.0.1:8002/v1
        [--turns 20] [--last 10] [--max-tokens 128] [--session PATH] [--json PATH]

Start both servers fresh for each run: the default one's index must hold this session only.

The session (benchmarks/data/agent_session.json) is a list of user turns around one small module:
write it, write its tests, fix what the scripted test runs report, add features. A turn may quote
the last code block of an earlier reply (``code_from``), as an agent re-sends a file it read
back. Each request re-sends the whole conversation so far, the earlier replies as assistant
messages; both servers get the same messages (built from the default server's replies, which
the target-only ones must equal: the decoding is greedy, temperature 0 and seed 0). The order of
the two requests swaps every turn.

Per request it prints the prompt and reply tokens, the decode speed both ways (the server's
``specchat.decode_tokens_per_s``: prompt processing excluded), their ratio, the tokens per
target call and the tokens each draft source had accepted; then, over the last ``--last``
requests, the geometric mean of the ratios and the ratio of the total speeds (all their tokens
over all their decode time), and whether both reach the target of 1.3x.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from chatapp.bench.api_client import Message, guarded, post_completion, request_body
from chatapp.bench.report import geometric_mean

SESSION_PATH = Path(__file__).resolve().parent / "data" / "agent_session.json"
SPEEDUP_TARGET = 1.3  # the last requests' speed with the index, over target-only
_CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Turn:
    """A user turn; ``{code}`` in ``user`` stands for the last code block of the reply to turn
    ``code_from`` (1-based)."""

    user: str
    code_from: int | None = None


def load_session(path: Path = SESSION_PATH) -> list[Turn]:
    """The turns of ``path`` (``{"turns": [{"user": TEXT, "code_from"?: N}]}``); ``ValueError``
    that names the problem for anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        turns = [Turn(str(item["user"]), item.get("code_from")) for item in data["turns"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not an agent session ({error}): it must be JSON "
                         '{"turns": [{"user": TEXT, "code_from": N}, ...]}') from None
    for number, turn in enumerate(turns, 1):
        if turn.code_from is not None and not (
                isinstance(turn.code_from, int) and 1 <= turn.code_from < number):
            raise ValueError(f"{path}: turn {number} quotes turn {turn.code_from!r}; code_from "
                             "must be the number of an earlier turn")
    return turns


def last_code(reply: str) -> str:
    """The last fenced code block of ``reply`` (a block cut short by the reply's end counts),
    ending with a newline; the whole reply when it has none."""
    blocks = _CODE_BLOCK.findall(reply)
    code = blocks[-1] if blocks else reply
    return code if code.endswith("\n") else code + "\n"


def user_message(turn: Turn, replies: Sequence[str]) -> str:
    """The turn's text, its ``{code}`` replaced (``replies``: the replies so far, in order)."""
    if turn.code_from is None:
        return turn.user
    return turn.user.replace("{code}", last_code(replies[turn.code_from - 1]))


@dataclass(frozen=True)
class Served:
    """One reply and the server's figures for it (decode time in seconds)."""

    text: str
    prompt_tokens: int
    tokens: int
    decode_s: float
    tokens_per_target_call: float
    accepted_by_source: dict[str, int]


def serve_once(base_url: str, messages: Sequence[Message], max_tokens: int,
               api_key: str | None) -> Served:
    answer = post_completion(base_url, request_body(messages, max_tokens), api_key)
    figures = answer["specchat"]
    sources = {name: source["accepted"] for name, source in figures["sources"].items()}
    return Served(answer["choices"][0]["message"]["content"], answer["usage"]["prompt_tokens"],
                  answer["usage"]["completion_tokens"], figures["total_s"] - figures["prompt_s"],
                  figures["tokens_per_target_call"], sources)


@dataclass(frozen=True)
class Step:
    """One request sent both ways (speeds in decode tokens per second)."""

    turn: int
    prompt_tokens: int
    tokens: int
    default_tokens_per_s: float
    plain_tokens_per_s: float
    default_decode_s: float
    plain_tokens: int
    plain_decode_s: float
    tokens_per_target_call: float
    accepted_by_source: dict[str, int]
    same_reply: bool

    @property
    def ratio(self) -> float:
        return self.default_tokens_per_s / self.plain_tokens_per_s if (
            self.plain_tokens_per_s) else 0.0


def _step(number: int, default: Served, plain: Served) -> Step:
    def speed(served: Served) -> float:
        return served.tokens / served.decode_s if served.decode_s > 0 else 0.0

    return Step(number, default.prompt_tokens, default.tokens, speed(default), speed(plain),
                default.decode_s, plain.tokens, plain.decode_s, default.tokens_per_target_call,
                default.accepted_by_source, default.text == plain.text)


def print_step(step: Step, out: TextIO) -> None:
    sources = ", ".join(f"{name} {count}" for name, count in sorted(
        step.accepted_by_source.items())) or "-"
    print(f"| {step.turn} | {step.prompt_tokens} | {step.tokens} | "
          f"{step.default_tokens_per_s:.2f} | {step.plain_tokens_per_s:.2f} | {step.ratio:.2f}x "
          f"| {step.tokens_per_target_call:.2f} | {sources} | "
          f"{'yes' if step.same_reply else 'NO'} |", file=out, flush=True)


def run_session(default_url: str, plain_url: str, turns: Sequence[Turn], max_tokens: int,
                out: TextIO, api_key: str | None = None) -> list[Step]:
    """Every turn to both servers (see the module docstring), a Markdown table row each."""
    print("| request | prompt tokens | tokens | tok/s default | tok/s target-only | ratio | "
          "tokens per target call | accepted by source | same reply |", file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    messages: list[Message] = []
    replies: list[str] = []
    steps = []
    for number, turn in enumerate(turns, 1):
        messages.append({"role": "user", "content": user_message(turn, replies)})
        if number % 2:
            default = serve_once(default_url, messages, max_tokens, api_key)
            plain = serve_once(plain_url, messages, max_tokens, api_key)
        else:
            plain = serve_once(plain_url, messages, max_tokens, api_key)
            default = serve_once(default_url, messages, max_tokens, api_key)
        steps.append(_step(number, default, plain))
        print_step(steps[-1], out)
        replies.append(default.text)
        messages.append({"role": "assistant", "content": default.text})
    return steps


def summary(steps: Sequence[Step], last: int) -> dict[str, Any]:
    """Over the last ``last`` steps: the geometric mean of the speed ratios, the total speeds
    both ways and their ratio, and whether it met the target."""
    tail = list(steps)[-last:]
    default_s = sum(step.default_decode_s for step in tail)
    plain_s = sum(step.plain_decode_s for step in tail)
    default_tps = sum(step.tokens for step in tail) / default_s if default_s > 0 else 0.0
    plain_tps = sum(step.plain_tokens for step in tail) / plain_s if plain_s > 0 else 0.0
    total_ratio = default_tps / plain_tps if plain_tps > 0 else 0.0
    mean_ratio = geometric_mean([step.ratio for step in tail])
    return {"requests": len(tail), "geometric_mean_ratio": mean_ratio,
            "default_tokens_per_s": default_tps, "plain_tokens_per_s": plain_tps,
            "total_ratio": total_ratio, "target_met": min(mean_ratio, total_ratio) >= (
                SPEEDUP_TARGET), "same_replies": all(step.same_reply for step in steps)}


def print_summary(result: dict[str, Any], out: TextIO) -> None:
    print(f"\nLast {result['requests']} requests: geometric mean of the ratios "
          f"{result['geometric_mean_ratio']:.2f}x; all their tokens over all their decode time "
          f"{result['default_tokens_per_s']:.2f} tok/s with the default drafter, "
          f"{result['plain_tokens_per_s']:.2f} target-only ({result['total_ratio']:.2f}x); "
          f"target at least {SPEEDUP_TARGET}x both ways: "
          f"{'met' if result['target_met'] else 'NOT met'}. "
          f"Replies {'all equal' if result['same_replies'] else 'NOT all equal'}.", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_agent",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("default_url", help="the server with the default drafter")
    parser.add_argument("plain_url", help="the server started with -k 0 (target-only)")
    parser.add_argument("--turns", type=int, default=20, help="the first N turns of the session")
    parser.add_argument("--last", type=int, default=10, help="the requests the summary covers")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--session", type=Path, default=SESSION_PATH, help="another session, "
                        "same JSON layout as benchmarks/data/agent_session.json")
    parser.add_argument("--api-key", help="the servers' key, if they have one")
    parser.add_argument("--json", dest="json_path", type=Path, help="also write results here")
    args = parser.parse_args(argv)

    def measure_all() -> None:
        if min(args.turns, args.last, args.max_tokens) < 1:
            raise ValueError("--turns, --last and --max-tokens must be at least 1")
        turns = load_session(args.session)[:args.turns]
        steps = run_session(args.default_url, args.plain_url, turns, args.max_tokens,
                            sys.stdout, args.api_key)
        result = summary(steps, args.last)
        print_summary(result, sys.stdout)
        if args.json_path is not None:
            data = {"steps": [asdict(step) | {"ratio": step.ratio} for step in steps],
                    "summary": result}
            args.json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    return guarded("serve_agent", measure_all)


if __name__ == "__main__":
    sys.exit(main())
