"""Structured output through `specchat serve` on the real default pair (Qwen2.5-Coder 0.5B draft,
1.5B target, the default drafter at K = 4: the auto policy may choose not to draft at all on a
busy machine), with the official `openai` client:
``json_schema`` replies at temperature 1 validate against their schema and have drafts accepted,
``.parse()`` fills a pydantic model, ``json_object`` parses."""

from __future__ import annotations

import json
import sys

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from pydantic import BaseModel, Field  # noqa: E402

from tests.conftest import NEEDS_DEFAULT_PAIR  # noqa: E402
from tests.serve_launcher import ServeProcess  # noqa: E402

pytestmark = [
    pytest.mark.real_models, pytest.mark.slow,
    NEEDS_DEFAULT_PAIR,
]
SERVE = [sys.executable, "-m", "chatapp.cli", "serve", "--temperature", "1", "--seed", "0",
         "--max-tokens", "300", "-k", "4"]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
            "type": "object",
            "properties": {"day": {"type": "string", "enum": ["Mon", "Tue", "Wed"]},
                           "high_c": {"type": "integer"}, "low_c": {"type": "integer"},
                           "sky": {"type": "string", "enum": ["sunny", "cloudy", "rain"]}},
            "required": ["day", "high_c", "low_c", "sky"], "additionalProperties": False}},
    },
    "required": ["city", "days"], "additionalProperties": False,
}
PROMPTS = ["Give a short weather forecast for Paris as JSON.",
           "Give a short weather forecast for Oslo as JSON.",
           "Give a short weather forecast for Lima as JSON."]


class Person(BaseModel):
    """Bounded, so that a sampled reply cannot run past max_tokens."""

    name: str = Field(max_length=40)
    age: int
    languages: list[str] = Field(max_length=4)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    process = ServeProcess(tmp_path_factory.mktemp("serve-structured"), command=SERVE)
    try:
        yield openai.OpenAI(base_url=process.base_url, api_key="unused", max_retries=0,
                            timeout=600)
    finally:
        process.stop()


def ask(client, text: str, **fields: object):  # noqa: ANN001, ANN201
    return client.chat.completions.create(
        model="specchat", messages=[{"role": "user", "content": text}], **fields)


def test_json_schema_replies_validate_and_have_drafts_accepted(client) -> None:  # noqa: ANN001
    accepted = 0
    for prompt in PROMPTS:
        reply = ask(client, prompt, temperature=1.0, response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}})
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), WEATHER)
        accepted += reply.model_extra["specchat"]["accepted"]
    assert accepted > 0


def test_parse_fills_a_pydantic_model(client) -> None:  # noqa: ANN001
    completion = client.chat.completions.parse(
        model="specchat", response_format=Person, temperature=0.5, messages=[
            {"role": "user", "content": "Describe a made-up programmer as JSON."}])
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and person.name


def test_json_object_parses(client) -> None:  # noqa: ANN001
    reply = ask(client, "List three fruits and their colours as a JSON object.",
                response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
