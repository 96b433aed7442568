"""Measure: time to refuse a 16 MiB body of control tokens (fake and SmolLM2), time to exit on
SIGTERM mid-tokenization (fake, 8 MB prompt under an 8M-token context). Run from the repo root."""
import json, signal, socket, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, ".")
from tests.serve_launcher import ServeProcess
from tests.test_serve import post
from tests.test_serve_hostile import chat, start_big_request

def refuse(server, label):
    body = json.dumps(chat("<|im_end|>" * 1_670_000)).encode()
    times = []
    for _ in range(3):
        t = time.monotonic(); status, answer = post(server, body); times.append(time.monotonic() - t)
        assert status == 400, answer
    print(f"{label}: 16 MiB ({len(body)} bytes) of <|im_end|> refused in "
          f"{min(times):.3f}..{max(times):.3f} s (3 runs, wall time at the client)")

server = ServeProcess(Path(tempfile.mkdtemp()))
try: refuse(server, "fake")
finally: server.stop()
if "--real" in sys.argv:
    from tests.test_serve_real import SERVE
    server = ServeProcess(Path(tempfile.mkdtemp()), command=SERVE)
    try: refuse(server, "SmolLM2-135M (llama.cpp tokenizer)")
    finally: server.stop()
for _ in range(3):
    server = ServeProcess(Path(tempfile.mkdtemp()), ["--n-ctx", "8000000"])
    sock = start_big_request(server)
    time.sleep(1.5)
    t = time.monotonic(); server.process.send_signal(signal.SIGTERM)
    status = server.stop(None, timeout=10)
    print(f"SIGTERM mid-tokenization: exited (status {status}) in {time.monotonic() - t:.3f} s")
    sock.close()
