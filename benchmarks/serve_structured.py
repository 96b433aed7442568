"""Structured output through the API: JSON-schema replies (``response_format`` ``json_schema``,
one ``json_object``) and forced tool calls (``tools`` with ``tool_choice``: a grammar too, the
call's arguments are the reply) from a `specchat serve` with its default drafting (auto draft
length) against one started with ``-k 0`` (target-only), for the speed-up that drafting keeps
under a grammar:

    python -m benchmarks.serve_structured [--rounds 3] [--max-tokens 256]
        [--server-args "MODEL OPTIONS"]

The tool starts both servers itself for every round (``python -m chatapp.cli serve
--temperature 0 --seed 0`` plus ``--server-args``; loading is not timed), sends every case once
to each, one request at a time, and stops them. The requests are greedy (temperature 0, seed 0),
so both servers draw the same reply but at a near-tie (see benchmarks/serve_prediction.py). Per
case it prints the tokens, the decode speed of each server (the server's
``specchat.decode_tokens_per_s``, prompt processing excluded; the median over the rounds), the
speed-up, the drafted and accepted tokens and the tokens per target call of the drafting server,
whether the replies were equal and parse as JSON; then the geometric mean of the speed-ups.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, TextIO

from chatapp.bench.api_client import guarded, post_completion, request_body
from chatapp.bench.report import geometric_mean
from chatapp.bench.serve_process import ServeProcess

SERVE = [sys.executable, "-m", "chatapp.cli", "serve", "--temperature", "0", "--seed", "0"]
_DAY = {"type": "object", "additionalProperties": False,
        "required": ["day", "high_c", "low_c", "sky"],
        "properties": {"day": {"type": "string"}, "high_c": {"type": "integer"},
                       "low_c": {"type": "integer"},
                       "sky": {"type": "string", "enum": ["sunny", "cloudy", "rain", "snow"]}}}
_USER = {"type": "object", "additionalProperties": False,
         "required": ["id", "name", "email", "role", "active"],
         "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                        "email": {"type": "string"},
                        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
                        "active": {"type": "boolean"}}}
_WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast for a city.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["city", "days", "unit"],
                   "properties": {"city": {"type": "string"},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
def _schema(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The request fields of a strict ``json_schema`` response format."""
    return {"response_format": {"type": "json_schema", "json_schema": {
        "name": name, "strict": True, "schema": schema}}}


# (name, prompt, the request's fields that shape the reply)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("weather-week", "Give a seven-day weather forecast for Paris as JSON.", _schema("forecast", {
        "type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string"},
                       "days": {"type": "array", "items": _DAY, "minItems": 7}}})),
    ("users-table", "Make up eight users of a small blogging site as JSON records.",
     _schema("users", {"type": "object", "additionalProperties": False, "required": ["users"],
                       "properties": {"users": {"type": "array", "items": _USER,
                                                "minItems": 8}}})),
    ("tool-args", "Call get_weather for Oslo, Lima and Tokyo in celsius: write the three calls' "
     "arguments as a JSON list.", _schema("calls", {
         "type": "array", "minItems": 3, "items": {
             "type": "object", "additionalProperties": False, "required": ["city", "unit"],
             "properties": {"city": {"type": "string"},
                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}})),
    ("json-object", "Describe the planets of the solar system as a JSON object, one key each.",
     {"response_format": {"type": "json_object"}}),
    ("tool-call", "What will the weather be in Oslo over the next five days, in celsius?",
     {"tools": [_WEATHER_TOOL], "tool_choice": "required"}),
]


@dataclass(frozen=True)
class Reply:
    """What one request gave: the text and the server's figures."""

    text: str
    tokens: int
    decode_tokens_per_s: float
    tokens_per_target_call: float
    drafted: int
    accepted: int

    @property
    def parses(self) -> bool:
        try:
            json.loads(self.text)
        except ValueError:
            return False
        return True


def complete(base_url: str, prompt: str, fields: dict[str, Any], max_tokens: int) -> Reply:
    """One greedy chat completion of ``prompt`` at ``base_url`` (".../v1"), shaped by
    ``fields``; a tool call's arguments are its text."""
    body = request_body([{"role": "user", "content": prompt}], max_tokens, **fields)
    answer = post_completion(base_url, body)
    figures = answer["specchat"]
    message = answer["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    text = calls[0]["function"]["arguments"] if calls else message["content"]
    return Reply(text, answer["usage"]["completion_tokens"], figures["decode_tokens_per_s"],
                 figures["tokens_per_target_call"], figures["drafted"], figures["accepted"])


@dataclass
class CaseResult:
    """One case's replies, one per round, from each server."""

    drafting: list[Reply] = field(default_factory=list)
    target_only: list[Reply] = field(default_factory=list)

    @staticmethod
    def speed(replies: Sequence[Reply]) -> float:
        return median(reply.decode_tokens_per_s for reply in replies) if replies else 0.0

    @property
    def speedup(self) -> float:
        reference = self.speed(self.target_only)
        return self.speed(self.drafting) / reference if reference else 0.0


def measure(max_tokens: int, rounds: int, server_args: Sequence[str], out: TextIO,
            serve: Sequence[str] = tuple(SERVE)) -> list[CaseResult]:
    """``rounds`` rounds over fresh servers, then the table on ``out``; results in case order."""
    results = [CaseResult() for _ in CASES]
    for _ in range(rounds):
        with ServeProcess([*serve, *server_args]) as drafting, \
                ServeProcess([*serve, *server_args, "-k", "0"]) as target:
            for (_, prompt, fields), result in zip(CASES, results, strict=True):
                result.drafting.append(complete(drafting.base_url, prompt, fields, max_tokens))
                result.target_only.append(complete(target.base_url, prompt, fields,
                                                   max_tokens))
    print_table(results, max_tokens, out)
    return results


def print_table(results: Sequence[CaseResult], max_tokens: int, out: TextIO) -> None:
    print("| case | tokens | tok/s target-only | tok/s auto | speed-up | drafted / accepted "
          "| tokens per target call | same reply | parses |", file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    for (name, _, _), result in zip(CASES, results, strict=True):
        last = result.drafting[-1]
        same = all(a.text == b.text for a, b in zip(result.drafting, result.target_only))
        print(f"| {name} | {last.tokens} | {result.speed(result.target_only):.2f} | "
              f"{result.speed(result.drafting):.2f} | {result.speedup:.2f}x | "
              f"{last.drafted} / {last.accepted} | {last.tokens_per_target_call:.2f} | "
              f"{'yes' if same else 'no'} | {'yes' if last.parses else 'no'} |", file=out)
    rounds = len(results[0].drafting) if results else 0
    print(f"\nSpeed-up over target-only: {geometric_mean([r.speedup for r in results]):.2f}x "
          f"(geometric mean, {len(results)} cases, up to {max_tokens} tokens each, median of "
          f"{rounds} rounds)", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_structured",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over fresh servers (the median speed is shown)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--server-args", default="", help="model options for the servers, "
                        "quoted as one argument (e.g. \"--target qwen2.5-coder-1.5b\")")
    args = parser.parse_args(argv)

    def measure_all() -> None:
        if min(args.rounds, args.max_tokens) < 1:
            raise ValueError("--rounds and --max-tokens must be at least 1")
        measure(args.max_tokens, args.rounds,
                [*shlex.split(args.server_args), "--max-tokens", str(args.max_tokens)],
                sys.stdout)

    return guarded("serve_structured", measure_all)


if __name__ == "__main__":
    sys.exit(main())
