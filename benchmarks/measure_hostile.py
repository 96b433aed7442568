"""The measurements of docs/hostile-input.md: the time to refuse a 16 MiB body of control tokens
(fake backend; with ``--real`` also SmolLM2 on llama.cpp), and the time from SIGTERM to the exit
while a prompt is tokenized (fake, an 8 MB prompt under an 8M-token context).

    python -m benchmarks.measure_hostile [--real]     (from the repository root)
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.serve_launcher import ServeProcess  # noqa: E402
from tests.test_serve import post  # noqa: E402
from tests.test_serve_hostile import chat, start_big_request  # noqa: E402

RUNS = 3
START_TIMEOUT_S = 300


def refusal_times(server: ServeProcess) -> list[float]:
    """Seconds from sending a 16 MiB body of ``<|im_end|>`` to its 400, at the client."""
    body = json.dumps(chat("<|im_end|>" * 1_670_000)).encode()
    times = []
    for _ in range(RUNS):
        started = time.monotonic()
        status, answer = post(server, body)
        times.append(time.monotonic() - started)
        assert status == 400, answer
    return times


def measure_refusal(label: str, command: list[str] | None) -> None:
    server = ServeProcess(Path(tempfile.mkdtemp()), command=command, timeout=START_TIMEOUT_S)
    try:
        times = refusal_times(server)
    finally:
        server.stop()
    print(f"{label}: 16 MiB of <|im_end|> refused in {min(times):.3f}..{max(times):.3f} s "
          f"({RUNS} runs)")


def measure_sigterm() -> None:
    for _ in range(RUNS):
        server = ServeProcess(Path(tempfile.mkdtemp()), ["--n-ctx", "8000000"],
                              timeout=START_TIMEOUT_S)
        sock = start_big_request(server)
        time.sleep(1.5)  # the body is read and its tokenization under way
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        status = server.stop(None, timeout=10)
        print(f"SIGTERM mid-tokenization: exit status {status} after "
              f"{time.monotonic() - started:.3f} s")
        sock.close()


def main() -> None:
    measure_refusal("fake", None)
    if "--real" in sys.argv:
        from tests.test_serve_real import SERVE

        measure_refusal("SmolLM2-135M (llama.cpp's tokenizer)", SERVE)
    measure_sigterm()


if __name__ == "__main__":
    main()
