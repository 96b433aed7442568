"""Whether the parts of a step's cost move together over time: the target verifies 1, 2, 4 and
16 tokens in turn (one token between each larger batch) for ``--seconds``, after the chat prompt
the calibration uses, the cache truncated back after each timing. Prints, per block of
``--block`` cycles, the median milliseconds of each size, their ratios to one token, and two
factors against the first block: the one-token cost's, and that of what the further tokens add
(over 2, 4 and 16 tokens together). ``VerifyCostModel`` scales its calibrated curve by one
factor; where these two part, that factor is wrong for one side (docs/benchmarks.md).

    python -m benchmarks.cost_phases [--seconds 90] [--block 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from chatapp.assembly.loader import CALIBRATION_TEXT, load_backend
from chatapp.backends.base import Backend
from chatapp.chat.message import ChatMessage
from chatapp.engine.calibration import repeated_feed
from chatapp.engine.kv import evaluate_sequence
from chatapp.settings.config import Config

SIZES = (1, 2, 4, 16)
CYCLE = (1, 2, 1, 4, 1, 16)  # one cycle of timings


def timed_cycles(target: Backend, seconds: float) -> list[dict[int, float]]:
    """Per cycle of ``CYCLE``, the mean milliseconds of each size, for ``seconds``."""
    context = target.chat_prompt([ChatMessage("user", CALIBRATION_TEXT)])
    feed = repeated_feed(context, max(SIZES))
    evaluate_sequence(target, context, 1)
    cycles = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        times: dict[int, list[float]] = {}
        for n in CYCLE:
            started = time.perf_counter()
            target.evaluate(feed[:n], n)
            times.setdefault(n, []).append(1000 * (time.perf_counter() - started))
            target.truncate(len(context))
        cycles.append({n: statistics.mean(values) for n, values in times.items()})
    return cycles


def factors(block: dict[int, float], first: dict[int, float]) -> tuple[float, float]:
    """The one-token cost of ``block`` over that of ``first``, and what the further tokens add
    in ``block`` (summed over the sizes above one) over the same in ``first``."""
    added = sum(block[n] - block[1] for n in SIZES[1:])
    return block[1] / first[1], added / sum(first[n] - first[1] for n in SIZES[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    config = dataclasses.replace(Config(), threads=args.threads)
    target = load_backend(config.target, "target", config)
    try:
        cycles = timed_cycles(target, args.seconds)
    finally:
        target.close()
    first = None
    for start in range(0, len(cycles) - args.block + 1, args.block):
        chunk = cycles[start:start + args.block]
        block = {n: statistics.median(c[n] for c in chunk) for n in SIZES}
        first = first or block
        one, added = factors(block, first)
        sizes = "  ".join(f"{n}: {block[n]:5.1f}" for n in SIZES)
        ratios = "  ".join(f"{n}/1 {block[n] / block[1]:.2f}" for n in SIZES[1:])
        print(f"cycles {start:4d}+  ms {sizes}  {ratios}  one-token x{one:.2f}  "
              f"added x{added:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
