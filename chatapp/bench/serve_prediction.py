"""Predicted outputs through the API: the code-edit prompts of `specchat bench` sent to two
`specchat serve` servers started with the same settings, one request without ``prediction``,
then the same with the prompt's original code as ``prediction`` (as editors send it), and
optionally to a third started with ``-k 0`` (target-only) for the speed-ups:

    python -m chatapp.bench.serve_prediction PLAIN_URL PREDICTED_URL [--target-only URL]
        [--prompts code-edit] [--max-tokens 128] [--repeats 1] [--api-key KEY]

Separate servers, because each keeps an in-memory suffix index over what it served: with one
server the second request of a prompt would draft from the first one's reply (so a repeat
drafts from the earlier repeats' replies on both servers alike). The requests are greedy
(temperature 0, seed 0), one at a time, alternating between the servers. Per prompt it prints the
tokens, the decode speed of each (the server's ``specchat.decode_tokens_per_s``: prompt
processing excluded; with ``--repeats``, the median), their ratio, the speed-ups over
target-only, the prediction tokens accepted and rejected, and the tokens per target call; then
the geometric means, and whether the replies were equal (they must be: a prediction can make a
reply faster, never different).

It talks HTTP only (the standard library's client), like any other client of the server.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import TextIO

from chatapp.bench.api_client import guarded, post_completion, request_body
from chatapp.bench.report import geometric_mean
from chatapp.bench.specs import BenchPrompt, load_prompts, select_prompts

_CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)


def original_code(prompt: str) -> str:
    """The code an edit prompt quotes: its first fenced block (else what follows the first blank
    line, else the whole prompt)."""
    block = _CODE_BLOCK.search(prompt)
    if block:
        return block.group(1)
    _, blank, rest = prompt.partition("\n\n")
    return rest if blank else prompt


@dataclass(frozen=True)
class Reply:
    """What one request gave: the text and the server's figures."""

    text: str
    tokens: int
    decode_tokens_per_s: float
    tokens_per_target_call: float
    accepted_prediction: int
    rejected_prediction: int


def complete(base_url: str, prompt: str, max_tokens: int, prediction: str | None,
             api_key: str | None = None) -> Reply:
    """One greedy chat completion of ``prompt`` at ``base_url`` (".../v1")."""
    extra = {"prediction": {"type": "content", "content": prediction}} if (
        prediction is not None) else {}
    body = request_body([{"role": "user", "content": prompt}], max_tokens, **extra)
    answer = post_completion(base_url, body, api_key)
    usage, figures = answer["usage"], answer["specchat"]
    details = usage["completion_tokens_details"]
    return Reply(answer["choices"][0]["message"]["content"], usage["completion_tokens"],
                 figures["decode_tokens_per_s"], figures["tokens_per_target_call"],
                 details["accepted_prediction_tokens"], details["rejected_prediction_tokens"])


@dataclass(frozen=True)
class PromptResult:
    """One prompt's replies: without and with the prediction (and target-only), each repeat."""

    without: list[Reply]
    with_prediction: list[Reply]
    target_only: list[Reply]

    @staticmethod
    def speed(replies: Sequence[Reply]) -> float:
        return median(reply.decode_tokens_per_s for reply in replies) if replies else 0.0

    @property
    def ratio(self) -> float:
        """With the prediction against without it."""
        return _ratio(self.speed(self.with_prediction), self.speed(self.without))

    @property
    def same_replies(self) -> bool:
        texts = {reply.text for reply in self.without + self.with_prediction + self.target_only}
        return len(texts) == 1


def _ratio(speed: float, reference: float) -> float:
    return speed / reference if reference else 0.0


def measure(plain_url: str, predicted_url: str, prompts: Sequence[BenchPrompt],
            max_tokens: int, out: TextIO, api_key: str | None = None,
            target_url: str | None = None, repeats: int = 1) -> list[float]:
    """Run every prompt both ways (and target-only with ``target_url``), ``repeats`` times, and
    print a Markdown table; the speed ratios (with / without the prediction), in prompt order."""
    print("| prompt | tokens | tok/s target-only | tok/s without | tok/s with | with / without "
          "| speed-up without / with | accepted / rejected prediction tokens "
          "| tokens per target call without / with | same reply |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    results = []
    for prompt in prompts:
        result = PromptResult([], [], [])
        for _ in range(repeats):
            result.without.append(complete(plain_url, prompt.text, max_tokens, None, api_key))
            result.with_prediction.append(complete(
                predicted_url, prompt.text, max_tokens, original_code(prompt.text), api_key))
            if target_url is not None:
                result.target_only.append(complete(target_url, prompt.text, max_tokens, None,
                                                   api_key))
        results.append(result)
        _print_row(prompt.id, result, out)
    _print_summary(results, max_tokens, out)
    return [result.ratio for result in results]


def _print_row(prompt_id: str, result: PromptResult, out: TextIO) -> None:
    plain, predicted = result.without[-1], result.with_prediction[-1]
    target = result.speed(result.target_only)
    without, with_ = result.speed(result.without), result.speed(result.with_prediction)
    speedups = (f"{_ratio(without, target):.2f}x / {_ratio(with_, target):.2f}x" if target
                else "-")
    print(f"| {prompt_id} | {plain.tokens} | {target:.2f} | {without:.2f} | {with_:.2f} | "
          f"{result.ratio:.2f}x | {speedups} | "
          f"{predicted.accepted_prediction} / {predicted.rejected_prediction} | "
          f"{plain.tokens_per_target_call:.2f} / {predicted.tokens_per_target_call:.2f} | "
          f"{'yes' if result.same_replies else 'NO'} |", file=out, flush=True)


def _print_summary(results: Sequence[PromptResult], max_tokens: int, out: TextIO) -> None:
    repeats = len(results[0].without) if results else 0
    print(f"\nGeometric mean of the ratios with / without: "
          f"{geometric_mean([result.ratio for result in results]):.2f}x "
          f"({len(results)} prompts, up to {max_tokens} tokens each, median of {repeats})",
          file=out)
    if results and results[0].target_only:
        for name, pick in (("without", lambda r: r.without),
                           ("with", lambda r: r.with_prediction)):
            speedup = geometric_mean([_ratio(r.speed(pick(r)), r.speed(r.target_only))
                                      for r in results])
            print(f"Speed-up over target-only {name} the prediction: {speedup:.2f}x "
                  "(geometric mean)", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chatapp.bench.serve_prediction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("plain_url", help="the server for the requests without prediction")
    parser.add_argument("predicted_url", help="the server for the requests with it")
    parser.add_argument("--target-only", dest="target_url", metavar="URL",
                        help="a server started with -k 0, for the speed-ups")
    parser.add_argument("--repeats", type=int, default=1,
                        help="requests per prompt and server (the median speed is shown)")
    parser.add_argument("--prompts", default="code-edit",
                        help="bench prompt ids or categories, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--api-key", help="the servers' key, if they have one")
    args = parser.parse_args(argv)

    def measure_all() -> None:
        if min(args.repeats, args.max_tokens) < 1:
            raise ValueError("--repeats and --max-tokens must be at least 1")
        prompts = select_prompts(load_prompts(), args.prompts)
        measure(args.plain_url, args.predicted_url, prompts, args.max_tokens, sys.stdout,
                args.api_key, args.target_url, args.repeats)

    return guarded("serve_prediction", measure_all)


if __name__ == "__main__":
    sys.exit(main())
