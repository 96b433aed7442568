"""A reply held to a grammar, on the fakes: through the exchange (the API's path: the session,
the default drafter, the engine), how it ends, greedy and sampled; what llguidance sees of a
vocabulary; a grammar that does not compile; ``response_format`` as the request schema reads it.
The law of constrained replies is tests/test_grammar_exactness.py's."""

from __future__ import annotations

import dataclasses
import re
import threading

import numpy as np
import pytest
from pydantic import ValidationError

from chatapp.api.exchange import GrammarError
from chatapp.backends.fake import STOP_ID, FakeBackend
from chatapp.chat.reply_grammar import ReplyGrammar
from chatapp.chat.reply_values import Ending
from chatapp.grammar.matcher import Grammars
from chatapp.grammar.vocabulary import SPECIAL_MARK, grammar_tokenizer
from chatapp.serve.schemas import ChatCompletionRequest
from tests.test_exchange import CONFIG, ask, exchange, run

# The fake's vocabulary spells these words ("the ", "spec", "draft ", "K" are tokens of it).
WORDS = ReplyGrammar('start: "the " ("spec" | "draft " | "a" | "b")+ "K"', "test words")
MATCH = re.compile(r"the (spec|draft |a|b)+K")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_reply_matches_its_grammar_and_ends_where_the_grammar_does(temperature: float) -> None:
    chat = exchange(max_tokens=200)
    for seed in range(8):
        _, result = run(chat, ask("the user asks", grammar=WORDS, temperature=temperature,
                                  seed=seed))
        assert MATCH.fullmatch(result.text), result.text
        assert result.finish_reason is Ending.STOP
    assert result.stats.drafted > 0


def test_a_greedy_constrained_reply_is_the_target_alones() -> None:
    """At temperature 0 drafting changes nothing under a grammar: the same reply as K = 0."""
    alone = exchange(200, dataclasses.replace(CONFIG, draft_length="0"))
    drafting = exchange(200)
    for prompt in ("the user asks", "the draft is the target", "spec spec spec"):
        _, plain = run(alone, ask(prompt, grammar=WORDS))
        _, drafted = run(drafting, ask(prompt, grammar=WORDS))
        assert drafted.text == plain.text and plain.stats.drafted == 0
    assert drafted.stats.drafted > 0


def test_without_a_grammar_the_same_request_says_other_things() -> None:
    """The control of the test above: the fakes' own replies do not match the grammar."""
    _, result = run(exchange(), ask("the user asks", temperature=1.0, seed=0))
    assert not MATCH.fullmatch(result.text)


def test_a_grammar_that_does_not_compile_is_refused_before_the_reply() -> None:
    with pytest.raises(GrammarError, match="response_format json_schema 'bad'.*objec"):
        list(exchange().run(ask("x", grammar=ReplyGrammar.json_schema(
            {"type": "objec"}, "response_format json_schema 'bad'")), threading.Event()))


def test_stop_tokens_and_markup_are_special_and_allowed_only_where_the_grammar_accepts() -> None:
    class Markup(FakeBackend):
        """A fake whose token 44 reads "<|x|>", which plain text never tokenizes to."""

        def token_bytes(self, token: int) -> bytes:
            return b"<|x|>" if token == 44 else super().token_bytes(token)

    backend = Markup()
    tokenizer = grammar_tokenizer(backend)
    assert tokenizer.is_special_token(STOP_ID) and tokenizer.is_special_token(44)
    assert not tokenizer.is_special_token(backend.tokenize("spec")[0])
    assert SPECIAL_MARK == b"\xff"
    constraint = Grammars(backend).constraint('start: "a"+', "a")
    assert not constraint.allowed()[STOP_ID] and not constraint.accepting
    constraint.consume(backend.tokenize("a")[0])
    mask = constraint.allowed()
    assert mask[STOP_ID] and constraint.accepting and not mask[44]
    assert np.flatnonzero(mask).tolist() == sorted([STOP_ID, backend.tokenize("a")[0]])
    constraint.rollback(1)
    assert not constraint.accepting


def test_a_grammar_the_vocabulary_cannot_spell_is_an_error_not_a_reply() -> None:
    constraint = Grammars(FakeBackend()).constraint('start: "{"', "braces")
    with pytest.raises(GrammarError, match="No token"):
        constraint.allowed()


def request(response_format: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "specchat", "messages": [{"role": "user", "content": "x"}],
        "response_format": response_format})


def test_response_formats_become_the_replys_grammar() -> None:
    assert request({"type": "text"}).exchange().grammar is None
    assert request({"type": "json_object"}).exchange().grammar == ReplyGrammar(
        'start: %json {"type": "object"}', "response_format json_object")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    grammar = request({"type": "json_schema", "json_schema": {
        "name": "place", "schema": schema, "strict": True}}).exchange().grammar
    assert grammar == ReplyGrammar.json_schema(schema, "response_format json_schema 'place'")
    assert grammar is not None and grammar.lark.startswith("start: %json {")


@pytest.mark.parametrize("response_format, words", [
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "regex", "pattern": "a+"}, "response formats of type 'regex' are not supported"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "name"),
])
def test_other_response_formats_are_refused(response_format: object, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        request(response_format)
