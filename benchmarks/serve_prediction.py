"""Predicted outputs through the API: the code-edit prompts of `specchat bench`, each sent to one
`specchat serve` without ``prediction``, to a second with the prompt's original code as
``prediction`` (as editors send it) and to a third started with ``-k 0`` (target-only), for the
ratio with / without and the speed-ups over target-only:

    python -m benchmarks.serve_prediction [--rounds 3] [--prompts code-edit]
        [--max-tokens 128] [--server-args "MODEL OPTIONS"] [--wrong]

Separate servers, because each keeps an in-memory suffix index over what it served: with one
server the second request of a prompt would draft from the first one's reply. The tool starts
the three servers itself for every round (``python -m chatapp.cli serve --temperature 0 --seed 0``
plus ``--server-args``; loading is not timed), sends every prompt once to each, one request at a
time (with and without the prediction in turn, their order swapped every prompt and round;
target-only last), and stops them; so no round drafts from another's replies. The requests are
greedy (temperature 0, seed 0). Per prompt it prints the tokens, the decode speed of each server
(the server's ``specchat.decode_tokens_per_s``: prompt processing excluded; the median over the
rounds), the ratio with / without, the speed-ups over target-only, the prediction tokens accepted
and rejected, the tokens per target call, and in how many rounds the replies with and without the
prediction were equal; then the geometric means. A prediction can make a reply faster, never
change what it is drawn from, but a greedy reply may part at a near-tie between two tokens when
the draft lengths change (llama.cpp's batched arithmetic differs slightly from its one-token
arithmetic), as target-only replies may. ``--wrong`` sends each prompt the next prompt's code as
its prediction instead (the last prompt the first's): what a wrong prediction costs.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import TextIO

from chatapp.bench.api_client import guarded, post_completion, request_body
from chatapp.bench.report import geometric_mean
from chatapp.bench.serve_process import ServeProcess
from chatapp.bench.specs import BenchPrompt, load_prompts, select_prompts

SERVE = [sys.executable, "-m", "chatapp.cli", "serve", "--temperature", "0", "--seed", "0"]
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


def complete(base_url: str, prompt: str, max_tokens: int, prediction: str | None) -> Reply:
    """One greedy chat completion of ``prompt`` at ``base_url`` (".../v1")."""
    extra = {"prediction": {"type": "content", "content": prediction}} if (
        prediction is not None) else {}
    body = request_body([{"role": "user", "content": prompt}], max_tokens, **extra)
    answer = post_completion(base_url, body)
    usage, figures = answer["usage"], answer["specchat"]
    details = usage["completion_tokens_details"]
    return Reply(answer["choices"][0]["message"]["content"], usage["completion_tokens"],
                 figures["decode_tokens_per_s"], figures["tokens_per_target_call"],
                 details["accepted_prediction_tokens"], details["rejected_prediction_tokens"])


@dataclass(frozen=True)
class PromptResult:
    """One prompt's replies, a reply per round: without and with the prediction, target-only."""

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

    def speedup(self, replies: Sequence[Reply]) -> float:
        """The median speed of ``replies`` against target-only's (0 without target-only)."""
        return _ratio(self.speed(replies), self.speed(self.target_only))

    @property
    def equal_rounds(self) -> int:
        """In how many rounds the replies with and without the prediction were equal."""
        return sum(plain.text == predicted.text
                   for plain, predicted in zip(self.without, self.with_prediction))

    @property
    def target_only_agrees(self) -> bool:
        return all(reply.text == self.without[0].text for reply in self.target_only)


def _ratio(speed: float, reference: float) -> float:
    return speed / reference if reference else 0.0


def predictions(prompts: Sequence[BenchPrompt], wrong: bool = False) -> list[str]:
    """The prediction sent with each prompt: the code it quotes, or with ``wrong`` the next
    prompt's (the last prompt's: the first's)."""
    codes = [original_code(prompt.text) for prompt in prompts]
    return codes[1:] + codes[:1] if wrong else codes


def measure_round(urls: tuple[str, str, str], prompts: Sequence[BenchPrompt],
                  predicted: Sequence[str], results: Sequence[PromptResult], max_tokens: int,
                  round_index: int = 0) -> None:
    """Each prompt once to each server, ``urls`` = (without, with its ``predicted`` text as the
    prediction, target-only); the replies go to ``results`` (one per prompt). The requests with
    and without the prediction swap places from one prompt to the next and from one round to the
    next (the first of a pair follows another process's request), target-only last."""
    plain_url, predicted_url, target_url = urls
    for index, (prompt, prediction, result) in enumerate(
            zip(prompts, predicted, results, strict=True)):
        def without() -> None:
            result.without.append(complete(plain_url, prompt.text, max_tokens, None))

        def with_prediction() -> None:
            result.with_prediction.append(complete(predicted_url, prompt.text, max_tokens,
                                                   prediction))

        pair = (without, with_prediction) if (index + round_index) % 2 == 0 else (
            with_prediction, without)
        for request in pair:
            request()
        result.target_only.append(complete(target_url, prompt.text, max_tokens, None))


def measure(prompts: Sequence[BenchPrompt], max_tokens: int, rounds: int,
            server_args: Sequence[str], out: TextIO,
            serve: Sequence[str] = tuple(SERVE), wrong: bool = False) -> list[PromptResult]:
    """``rounds`` rounds over fresh servers (``serve`` + ``server_args``: the command, without
    the port), then the table on ``out``; the results in prompt order. ``wrong``: see
    ``predictions``."""
    predicted = predictions(prompts, wrong)
    results = [PromptResult([], [], []) for _ in prompts]
    for round_index in range(rounds):
        with ServeProcess([*serve, *server_args]) as plain, \
                ServeProcess([*serve, *server_args]) as predicted_server, \
                ServeProcess([*serve, *server_args, "-k", "0"]) as target:
            measure_round((plain.base_url, predicted_server.base_url, target.base_url),
                          prompts, predicted, results, max_tokens, round_index)
    print_table(prompts, results, max_tokens, out)
    return results


def print_table(prompts: Sequence[BenchPrompt], results: Sequence[PromptResult],
                max_tokens: int, out: TextIO) -> None:
    """The Markdown table of ``results`` and its summary lines."""
    print("| prompt | tokens | tok/s target-only | tok/s without | tok/s with | with / without "
          "| speed-up without / with | accepted / rejected prediction tokens "
          "| tokens per target call without / with | rounds with the same reply with / without |",
          file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for prompt, result in zip(prompts, results, strict=True):
        plain, predicted = result.without[-1], result.with_prediction[-1]
        print(f"| {prompt.id} | {plain.tokens} | {result.speed(result.target_only):.2f} | "
              f"{result.speed(result.without):.2f} | "
              f"{result.speed(result.with_prediction):.2f} | {result.ratio:.2f}x | "
              f"{result.speedup(result.without):.2f}x / "
              f"{result.speedup(result.with_prediction):.2f}x | "
              f"{predicted.accepted_prediction} / {predicted.rejected_prediction} | "
              f"{plain.tokens_per_target_call:.2f} / {predicted.tokens_per_target_call:.2f} | "
              f"{result.equal_rounds} of {len(result.without)} |", file=out)
    rounds = len(results[0].without) if results else 0
    print(f"\nGeometric mean of the ratios with / without: "
          f"{geometric_mean([result.ratio for result in results]):.2f}x "
          f"({len(results)} prompts, up to {max_tokens} tokens each, median of {rounds} rounds)",
          file=out)
    for name, pick in (("without", lambda r: r.without), ("with", lambda r: r.with_prediction)):
        speedup = geometric_mean([r.speedup(pick(r)) for r in results])
        print(f"Speed-up over target-only {name} the prediction: {speedup:.2f}x "
              "(geometric mean)", file=out)
    differing = [p.id for p, r in zip(prompts, results, strict=True) if not r.target_only_agrees]
    if differing:
        print(f"Target-only replies part from the speculative ones at a near-tie: "
              f"{', '.join(differing)}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_prediction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over fresh servers (the median speed is shown)")
    parser.add_argument("--prompts", default="code-edit",
                        help="bench prompt ids or categories, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--server-args", default="", help="model options for the servers, "
                        "quoted as one argument (e.g. \"--target qwen2.5-coder-1.5b\")")
    parser.add_argument("--wrong", action="store_true",
                        help="send each prompt the next prompt's code as its prediction")
    args = parser.parse_args(argv)

    def measure_all() -> None:
        if min(args.rounds, args.max_tokens) < 1:
            raise ValueError("--rounds and --max-tokens must be at least 1")
        prompts = select_prompts(load_prompts(), args.prompts)
        if args.wrong and len(prompts) < 2:
            raise ValueError("--wrong needs at least two prompts (each gets another's code)")
        measure(prompts, args.max_tokens, args.rounds,
                [*shlex.split(args.server_args), "--max-tokens", str(args.max_tokens)],
                sys.stdout, wrong=args.wrong)

    return guarded("serve_prediction", measure_all)


if __name__ == "__main__":
    sys.exit(main())
