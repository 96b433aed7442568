"""How much the calibration's cost curve moves between fresh starts: the target is loaded
``--trials`` times and its verification costs measured each time as the app does
(``chatapp.assembly.loader.measure_calibration``). Prints, per trial, the one-token cost and
the costs of 4, 8, 15, 16 and 17 tokens over it, then the range of the one-token cost and of
the 16-token ratio (the cheap batch the policy drafts for).

    python -m benchmarks.calibration_spread [--trials 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from chatapp.assembly.loader import load_backend, measure_calibration
from chatapp.settings.config import Config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    config = dataclasses.replace(Config(), threads=args.threads)
    curves = []
    for trial in range(args.trials):
        target = load_backend(config.target, "target", config)
        started = time.perf_counter()
        costs = measure_calibration(target).verify
        target.close()
        curves.append(costs)
        ratios = "  ".join(f"{n}: {costs[n] / costs[1]:.2f}x" for n in (4, 8, 15, 16, 17))
        print(f"trial {trial} {time.perf_counter() - started:4.1f} s  "
              f"1: {1000 * costs[1]:.1f} ms  {ratios}", flush=True)
    ones = [1000 * c[1] for c in curves]
    sixteens = [c[16] / c[1] for c in curves]
    print(f"1 token {min(ones):.1f}-{max(ones):.1f} ms, 16 tokens "
          f"{min(sixteens):.2f}-{max(sixteens):.2f}x one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
