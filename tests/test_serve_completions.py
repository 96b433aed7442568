"""`POST /v1/completions` through the official `openai` client and raw HTTP, on fake backends
(tests/serve_launcher.py, with fill-in-the-middle tokens): OpenAI's text-completion shape, whole
and streamed, fill-in-the-middle, and the refusals."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from chatapp.backends.fake import FakeBackend  # noqa: E402
from tests.serve_launcher import ServeProcess  # noqa: E402
from tests.test_serve import raw  # noqa: E402

PREFIX = "the draft token is "
SUFFIX = " and the target token is the draft token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    process = ServeProcess(tmp_path_factory.mktemp("serve-fim"), ["--fake-fim"])
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory):
    """A server whose model has no fill-in-the-middle tokens."""
    process = ServeProcess(tmp_path_factory.mktemp("serve-plain"))
    try:
        yield process
    finally:
        process.stop()


def complete(server: ServeProcess, **fields: object):  # noqa: ANN201
    api = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)
    return api.completions.create(model=server.model, **fields)


def post(server: ServeProcess, payload: dict) -> tuple[int, dict]:
    status, _, data = raw(server, "POST", "/v1/completions", json.dumps(payload).encode())
    return status, json.loads(data)


def test_a_completion_is_a_text_completion_with_usage_and_statistics(server) -> None:
    reply = complete(server, prompt=PREFIX, suffix=SUFFIX, max_tokens=12)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    choice = reply.choices[0]
    assert choice.index == 0 and choice.finish_reason in ("stop", "length")
    assert isinstance(choice.text, str) and reply.usage.completion_tokens > 0
    fake = FakeBackend()
    assert reply.usage.prompt_tokens == 3 + len(fake.tokenize(PREFIX) + fake.tokenize(SUFFIX))
    assert reply.model_extra["specchat"]["target_calls"] > 0


def test_a_streamed_completion_is_the_whole_one(server) -> None:
    whole = complete(server, prompt=PREFIX, suffix=SUFFIX, max_tokens=16, seed=3)
    chunks = list(complete(server, prompt=PREFIX, suffix=SUFFIX, max_tokens=16, seed=3,
                           stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
        whole.usage.completion_tokens)


def test_a_completion_without_a_suffix_continues_the_prompt(server) -> None:
    reply = complete(server, prompt=[PREFIX], max_tokens=8)
    assert reply.usage.prompt_tokens == 4  # "the " "draft " "token " "is ": no template


def test_a_suffix_to_a_model_without_fim_tokens_is_refused_saying_why(plain_server) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        complete(plain_server, prompt=PREFIX, suffix=SUFFIX, max_tokens=8)
    error = refused.value.body
    assert error["param"] == "suffix" and "fill-in-the-middle tokens" in error["message"]
    assert complete(plain_server, prompt=PREFIX, max_tokens=4).usage.completion_tokens > 0


@pytest.mark.parametrize("fields, param", [
    ({"echo": True}, None), ({"n": 2}, "n"), ({"best_of": 3}, "best_of"),
    ({"logprobs": 2}, None), ({"prompt": [[1, 2, 3]]}, None),
    ({"prompt": ["a", "b"]}, None), ({"prompt": ""}, None), ({"frequency_penalty": 0.5}, None),
])
def test_what_cannot_be_honoured_is_refused(server, fields: dict, param: str | None) -> None:
    status, body = post(server, {"model": server.model, "prompt": PREFIX, **fields})
    assert status == 400, body
    if param is not None:
        assert body["error"]["param"] == param


def test_a_prompt_too_long_is_refused_as_the_prompt(server) -> None:
    status, body = post(server, {"model": server.model, "prompt": "the " * 5000,
                                 "suffix": SUFFIX})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "prompt"


def test_fields_a_completion_does_not_read_are_ignored_and_named(server) -> None:
    """As for chat: clients send what their other servers take; it is named, not refused."""
    body = {"model": server.model, "prompt": PREFIX, "max_tokens": 4, "tools": [],
            "repetition_penalty": 1.1}
    status, headers, data = raw(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 200, data
    ignored = {key.lower(): value for key, value in headers.items()}["x-specchat-ignored"]
    assert set(ignored.split(", ")) == {"tools", "repetition_penalty"}


def test_continues_autocompletion_request_is_answered_as_fill_in_the_middle(server) -> None:
    """Continue's tab completion against an OpenAI-compatible server (its `openai` provider):
    the FIM prompt written by the client, no `suffix`, all twelve of its stops, streamed."""
    body = {"model": "qwen2.5-coder-1.5b", "max_tokens": 256, "temperature": 0.01,
            "stream": True, "prompt": f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>",
            "stop": ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                     "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|im_start|>",
                     "<|im_end|>", "/src/", "#- coding: utf-8", "```"],
            "stream_options": {"include_usage": True}}
    status, _, data = raw(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 200, data
    events = [json.loads(line[6:]) for line in data.decode().splitlines()
              if line.startswith("data: {")]
    fake = FakeBackend()
    assert events[-1]["usage"]["prompt_tokens"] == 3 + len(fake.tokenize(PREFIX)
                                                           + fake.tokenize(SUFFIX))
