"""`specchat bench --verify-costs`: what verifying n tokens costs the target on this machine.

A speculation step feeds the target the last emitted token and K drafts (n = K + 1 tokens) and
needs logits at every one of them. On a CPU that cost is not a smooth curve of n (llama.cpp's
batched kernels work in blocks: on the 2-core EPYC of docs/benchmarks.md 16 tokens cost less than
15), and it is what the ``auto`` policy learns per n while it runs. This command measures the
whole curve at once, the way the engine evaluates: after a chat prompt, n tokens with logits for
every position, the cache truncated back after each timing; the median of ``REPEATS`` timings. It
times every n up to twice the longest draft ``auto`` makes, and a few longer batches
(``LONGER_SIZES``), says which size would gain most if every draft token were accepted (the most
any speculation can give here) and prints the consecutive costs as ``drafter_replay``'s
``--costs``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from typing import TextIO

from chatapp.assembly.loader import load_backend
from chatapp.bench.runner import machine_facts
from chatapp.bench.specs import BenchPrompt
from chatapp.chat.message import ChatMessage
from chatapp.engine.calibration import VerifyCost, measure_verify_costs, repeated_feed
from chatapp.engine.contracts import LONGEST_FREE_DRAFT
from chatapp.settings.config import Config

REPEATS = 5
LONGER_SIZES = (48, 64)  # beyond every n up to 2 x the longest draft: what long drafts could give


def print_verify_costs(out: TextIO, costs: Sequence[VerifyCost]) -> None:
    """The table: n, ms, x one token, ms per token, tokens per one-token time at full
    acceptance (the most a step of that size can yield against plain decoding)."""
    one = _one_token_seconds(costs)
    out.write(f"{'n':>3} {'ms':>8} {'x 1 token':>10} {'ms/token':>9} {'best speedup':>13}\n")
    for cost in costs:
        ms = cost.seconds * 1000
        relative = f"{cost.seconds / one:10.2f}" if one else f"{'-':>10}"
        ceiling = f"{cost.tokens * one / cost.seconds:12.2f}x" if one else f"{'-':>13}"
        out.write(f"{cost.tokens:3d} {ms:8.1f} {relative} {ms / cost.tokens:9.1f} {ceiling}\n")
    best = full_acceptance_ceiling(costs)
    if best is not None:
        out.write(f"Even with every draft token accepted, no step beats {best[1]:.2f}x plain "
                  f"decoding here (n = {best[0]}, of the sizes timed).\n")
    consecutive = [c for i, c in enumerate(costs, 1) if c.tokens == i]
    if consecutive:
        out.write("For python -m benchmarks.drafter_replay: --costs "
                  + ",".join(f"{c.seconds * 1000:.1f}" for c in consecutive) + "\n")


def full_acceptance_ceiling(costs: Sequence[VerifyCost]) -> tuple[int, float] | None:
    """The size whose step yields most tokens per one-token time when all of it is accepted,
    and that speedup (None without a one-token timing)."""
    one = _one_token_seconds(costs)
    if not one:
        return None
    best = max(costs, key=lambda c: c.tokens / c.seconds)
    return best.tokens, best.tokens * one / best.seconds


def _one_token_seconds(costs: Sequence[VerifyCost]) -> float | None:
    """The timing of one token, the plain decoding step every size is weighed against."""
    return next((c.seconds for c in costs if c.tokens == 1), None)


def verify_costs_command(config: Config, prompt: BenchPrompt, out: TextIO | None = None,
                         log: TextIO | None = None) -> int:
    """Load the target, measure n = 1..2 x ``LONGEST_FREE_DRAFT`` and ``LONGER_SIZES`` after
    ``prompt`` (as a chat turn), print the table."""
    out = out or sys.stdout
    log = log or sys.stderr
    target = load_backend(config.target, "target", config)
    try:
        context = target.chat_prompt([ChatMessage("user", prompt.text)])
        sizes = [*range(1, 2 * LONGEST_FREE_DRAFT + 1), *LONGER_SIZES]
        feed = repeated_feed(context, max(sizes))
        facts = machine_facts(config)
        print(f"Verification costs of {target.name}, {target.threads} threads, after "
              f"{len(context)} prompt tokens ({prompt.id}); median of {REPEATS}; CPU "
              f"{facts['cpu']}, AMX {'in use' if facts['amx_in_use'] else 'not in use'}:",
              file=log)
        print_verify_costs(out, measure_verify_costs(target, context, feed, sizes, REPEATS,
                                                         statistics.median))
    finally:
        target.close()
    return 0
