"""Predicted outputs through the API: the code-edit prompts of `specchat bench` sent to two
`specchat serve` servers started with the same settings, one request without ``prediction``,
then the same with the prompt's original code as ``prediction`` (as editors send it):

    python -m chatapp.bench.serve_prediction PLAIN_URL PREDICTED_URL [--prompts code-edit]
        [--max-tokens 128] [--api-key KEY]

Two servers, because each keeps an in-memory suffix index over what it served: with one server
the second request of a prompt would draft from the first one's reply. The requests are greedy
(temperature 0, seed 0), one at a time, alternating between the servers. Per prompt it prints the
tokens, the decode speed of each (the server's ``specchat.decode_tokens_per_s``: prompt
processing excluded), their ratio, the prediction tokens accepted and rejected, and the tokens
per target call; then the geometric mean of the ratios, and whether the replies were equal (they
must be: a prediction can make a reply faster, never different).

It talks HTTP only (the standard library's client), like any other client of the server.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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


def measure(plain_url: str, predicted_url: str, prompts: Sequence[BenchPrompt],
            max_tokens: int, out: TextIO, api_key: str | None = None) -> list[float]:
    """Run every prompt both ways and print a Markdown table; the speed ratios (with / without
    the prediction), in prompt order."""
    print("| prompt | tokens | tok/s without | tok/s with | ratio | accepted / rejected "
          "prediction tokens | tokens per target call without / with | same reply |", file=out)
    print("|---|---|---|---|---|---|---|---|", file=out)
    ratios = []
    for prompt in prompts:
        plain = complete(plain_url, prompt.text, max_tokens, None, api_key)
        predicted = complete(predicted_url, prompt.text, max_tokens, original_code(prompt.text),
                             api_key)
        ratio = predicted.decode_tokens_per_s / plain.decode_tokens_per_s if (
            plain.decode_tokens_per_s) else 0.0
        ratios.append(ratio)
        print(f"| {prompt.id} | {plain.tokens} | {plain.decode_tokens_per_s:.2f} | "
              f"{predicted.decode_tokens_per_s:.2f} | {ratio:.2f}x | "
              f"{predicted.accepted_prediction} / {predicted.rejected_prediction} | "
              f"{plain.tokens_per_target_call:.2f} / {predicted.tokens_per_target_call:.2f} | "
              f"{'yes' if plain.text == predicted.text else 'NO'} |", file=out, flush=True)
    print(f"\nGeometric mean of the ratios: {geometric_mean(ratios):.2f}x "
          f"({len(ratios)} prompts, up to {max_tokens} tokens each)", file=out)
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chatapp.bench.serve_prediction",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("plain_url", help="the server for the requests without prediction")
    parser.add_argument("predicted_url", help="the server for the requests with it")
    parser.add_argument("--prompts", default="code-edit",
                        help="bench prompt ids or categories, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--api-key", help="the servers' key, if they have one")
    args = parser.parse_args(argv)

    def measure_all() -> None:
        prompts = select_prompts(load_prompts(), args.prompts)
        measure(args.plain_url, args.predicted_url, prompts, args.max_tokens, sys.stdout,
                args.api_key)

    return guarded("serve_prediction", measure_all)


if __name__ == "__main__":
    sys.exit(main())
