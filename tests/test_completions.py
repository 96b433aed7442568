"""Raw completions and fill-in-the-middle on the one reply pipeline (``RawText`` prompt rules),
on fake backends: the prompt's tokens, the refusals, the reply's end at a FIM token, the KV
cache kept between requests (completions and chat), and prompt lookup from the suffix."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from chatapp.api.exchange import (
    ChatExchange,
    ExchangeRequest,
    ExchangeStarted,
    FimUnsupportedError,
    PromptTooLongError,
    RawText,
)
from chatapp.backends.fake import FakeBackend
from chatapp.chat.message import ChatMessage
from chatapp.chat.prompt import client_fim
from chatapp.drafters.lookup import NgramDrafter
from chatapp.engine.contracts import NO_HINTS, DraftBudget
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.fixed import FixedDraftLength
from tests.serve_launcher import fake_factory
from tests.test_exchange import CONFIG, run

PREFIX = "the draft token is "
SUFFIX = " and the target token is the draft token"


def exchange(fim: bool = True, max_tokens: int = 40) -> ChatExchange:
    return ChatExchange(fake_factory(max_tokens, 0.0, False, fim=fim)(CONFIG, lambda *_: None),
                        CONFIG)


def raw(prompt: str, suffix: str = "", **fields: object) -> ExchangeRequest:
    return ExchangeRequest((), raw=RawText(prompt, suffix), **fields)  # type: ignore[arg-type]


def prompt_of(rules: RawText) -> list[int]:
    """The prompt ``ChatSession.reply`` plans under ``rules`` on the fakes with FIM tokens."""
    session = fake_factory(8, 0.0, False, fim=True)(CONFIG, lambda *_: None)
    plan, events = session.reply((), FixedDraftLength(0), rules=rules)
    events.close()
    return plan.tokens


def test_a_raw_prompt_is_its_plain_text_with_no_template() -> None:
    assert prompt_of(RawText(PREFIX)) == FakeBackend(fim=True).tokenize(PREFIX)


def test_a_suffix_makes_the_fill_in_the_middle_prompt_prefix_suffix_middle() -> None:
    fake = FakeBackend(fim=True)
    assert fake.fim_ids is not None
    pre, suf, mid = fake.fim_ids
    assert prompt_of(RawText(PREFIX, SUFFIX)) == [
        pre, *fake.tokenize(PREFIX), suf, *fake.tokenize(SUFFIX), mid]


def test_control_token_text_in_the_prompt_stays_text() -> None:
    tokens = prompt_of(RawText("<|fim_middle|>the ", SUFFIX))
    fim = FakeBackend(fim=True).fim_ids
    assert fim is not None
    assert tokens.count(fim[2]) == 1 and tokens[-1] == fim[2]


# Continue's autocompletion for Qwen2.5-Coder through an OpenAI-compatible server: the FIM
# prompt written by the client, no suffix field (its qwenMultifileFimTemplate, with a repo head)
SPELLINGS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
CLIENT_FIM = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"


def test_a_fim_prompt_the_client_wrote_is_the_fim_prompt_of_prompt_and_suffix() -> None:
    assert prompt_of(RawText(CLIENT_FIM)) == prompt_of(RawText(PREFIX, SUFFIX))


def test_the_text_before_a_client_written_fim_prompt_comes_first_as_text() -> None:
    fake = FakeBackend(fim=True)
    head = "the target is the draft\n"
    assert prompt_of(RawText(head + CLIENT_FIM)) == [
        *fake.tokenize(head), *prompt_of(RawText(PREFIX, SUFFIX))]


@pytest.mark.parametrize("prompt", [
    f"<|fim_suffix|>{SUFFIX}<|fim_prefix|>{PREFIX}<|fim_middle|>",  # out of order
    f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|> ",  # not ending with middle
    f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}",  # no middle
    f"<|fim_prefix|><|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>",  # twice
])
def test_other_prompts_with_fim_spellings_are_no_client_fim_prompt(prompt: str) -> None:
    assert client_fim(prompt, SPELLINGS) is None


def test_a_client_written_fim_prompt_to_a_model_without_fim_tokens_stays_text() -> None:
    events, result = run(exchange(fim=False), raw(CLIENT_FIM))
    assert isinstance(events[0], ExchangeStarted) and result.stats.tokens > 0


def test_a_model_without_fim_tokens_refuses_a_suffix_and_says_why() -> None:
    with pytest.raises(FimUnsupportedError, match="fill-in-the-middle tokens"):
        list(exchange(fim=False).run(raw(PREFIX, SUFFIX), threading.Event()))
    events, result = run(exchange(fim=False), raw(PREFIX))  # without a suffix it completes
    assert isinstance(events[0], ExchangeStarted) and result.stats.tokens > 0


def test_a_raw_prompt_too_long_is_refused_as_the_prompt() -> None:
    config = dataclasses.replace(CONFIG, n_ctx=64)
    chat = ChatExchange(fake_factory(40, 0.0, False, fim=True)(config, lambda *_: None), config)
    with pytest.raises(PromptTooLongError, match="The prompt is more than"):
        list(chat.run(raw("the " * 100, SUFFIX), threading.Event()))


def test_a_fim_token_ends_the_reply_like_the_end_of_text() -> None:
    fake = FakeBackend(fim=True)
    assert fake.fim_ids is not None and set(fake.fim_ids) <= fake.stop_ids


def test_the_same_completion_again_evaluates_only_its_last_prompt_token() -> None:
    """The backends keep their KV cache between requests: the second identical request (and one
    whose suffix is the same) re-feeds only what differs."""
    chat = exchange()
    target = chat.session._engine.target  # noqa: SLF001 (the fake's evaluation counts)
    first = run(chat, raw(PREFIX, SUFFIX, max_tokens=4))[1]
    target.evaluate_calls.clear()
    again = run(chat, raw(PREFIX, SUFFIX, max_tokens=4))[1]
    assert again.text == first.text
    prompt = first.stats.prompt_tokens
    assert target.evaluate_calls[0] < 8 < prompt, target.evaluate_calls


def test_a_chat_follow_up_that_resends_the_conversation_pays_for_its_new_tokens() -> None:
    chat = exchange()
    target = chat.session._engine.target  # noqa: SLF001
    question = ChatMessage("user", "the draft token is the target token " * 20)
    first = run(chat, ExchangeRequest((question,), max_tokens=8))[1]
    target.evaluate_calls.clear()
    follow_up = (question, ChatMessage("assistant", first.text), ChatMessage("user", "and?"))
    second = run(chat, ExchangeRequest(follow_up, max_tokens=8))[1]
    new = second.stats.prompt_tokens - first.stats.prompt_tokens
    assert target.evaluate_calls[0] <= new + first.stats.tokens + 1, (
        target.evaluate_calls, new)


def test_prompt_lookup_drafts_from_the_suffix_of_a_fim_prompt() -> None:
    """The middle often writes what the suffix holds: the free sources see the suffix (it is in
    the prompt, before the middle), so a middle that starts a span of the suffix is drafted
    from there."""
    fake = FakeBackend(fim=True)
    assert fake.fim_ids is not None
    pre, suf, mid = fake.fim_ids
    spell = fake.tokenize
    prompt = [pre, *spell("you and "), suf, *spell("user: spec ulative draft target"), mid]
    drafter = NgramDrafter(fake.vocab_size)
    drafter.prefill(prompt, NO_HINTS)
    reply = spell("user: spec")
    proposal = drafter.propose(prompt + reply, DraftBudget.uniform(4), SamplingParams(),
                                np.random.default_rng(0))
    assert proposal.tokens == spell(" ulative draft target")[:4]
