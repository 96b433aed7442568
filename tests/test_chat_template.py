"""render_chat: Jinja chat templates rendered as transformers does, with a ChatML fallback the
user is told about."""

from __future__ import annotations

import pytest

from chatapp.backends.chat_template import render_chat
from chatapp.chat.message import ChatMessage

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi <b>there</b>")]

# The shape of SmolLM2's / Qwen's template: block tags on their own lines, which trim_blocks and
# lstrip_blocks must swallow.
INDENTED_CHATML = """
{%- for message in messages %}
    {% if loop.first and message['role'] != 'system' %}
<|im_start|>system
Default.<|im_end|>
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""

EXPECTED_CHATML = ("<|im_start|>system\nBe brief.<|im_end|>\n"
                   "<|im_start|>user\nHi <b>there</b><|im_end|>\n"
                   "<|im_start|>assistant\n")


def test_renders_template_with_trim_and_lstrip_blocks() -> None:
    assert render_chat(INDENTED_CHATML, MESSAGES, "<s>", "</s>") == (EXPECTED_CHATML, False)


def test_template_default_system_message_branch() -> None:
    text, fallback = render_chat(INDENTED_CHATML, [ChatMessage("user", "x")], "", "")
    assert not fallback
    assert text == ("<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_bos_and_eos_tokens_are_passed_in() -> None:
    template = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
                "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    text, fallback = render_chat(template, MESSAGES[1:], "<s>", "</s>")
    assert (text, fallback) == ("<s>[user]Hi <b>there</b></s>[assistant]", False)


def test_tojson_does_not_escape_html() -> None:
    template = "{% for m in messages %}{{ m.content | tojson }}{% endfor %}"
    assert render_chat(template, MESSAGES[1:], "", "") == ('"Hi <b>there</b>"', False)


def test_loopcontrols_extension_is_enabled() -> None:
    template = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}" \
               "{% endfor %}"
    assert render_chat(template, MESSAGES, "", "") == ("system", False)


def test_no_template_falls_back_to_chatml() -> None:
    assert render_chat(None, MESSAGES, "", "") == (EXPECTED_CHATML, True)
    assert render_chat("", MESSAGES, "", "") == (EXPECTED_CHATML, True)


def test_raise_exception_falls_back_to_chatml() -> None:
    template = "{{ raise_exception('Conversation roles must alternate') }}"
    assert render_chat(template, MESSAGES, "", "") == (EXPECTED_CHATML, True)


def test_syntax_error_falls_back_to_chatml() -> None:
    assert render_chat("{% for m in messages %}", MESSAGES, "", "") == (EXPECTED_CHATML, True)


def test_runtime_error_in_template_falls_back_to_chatml() -> None:
    assert render_chat("{{ messages[5]['content'] }}", MESSAGES, "", "") == (EXPECTED_CHATML, True)
    assert render_chat("{{ 1 / 0 }}", MESSAGES, "", "") == (EXPECTED_CHATML, True)
    assert render_chat("{{ messages[0].content.nope() }}", MESSAGES, "", "") == (
        EXPECTED_CHATML, True)


def test_undefined_attribute_renders_empty_as_in_transformers() -> None:
    assert render_chat("{{ messages[0].nope }}x", MESSAGES, "", "") == ("x", False)


def test_sandbox_blocks_escapes() -> None:
    template = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    assert render_chat(template, MESSAGES, "", "") == (EXPECTED_CHATML, True)


def test_sandbox_is_immutable() -> None:
    template = "{% set xs = [] %}{{ xs.append(1) }}"
    assert render_chat(template, MESSAGES, "", "") == (EXPECTED_CHATML, True)


def test_run_tells_the_user_when_the_model_has_no_chat_template(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import chatapp.assembly.loader
    from chatapp.backends.fake import FakeBackend
    from chatapp.chat.session import ChatSession
    from chatapp.cli import main
    from chatapp.engine.loop import GenerationSettings, SpeculativeEngine

    def fake_session(config, progress, with_draft=True):
        target = FakeBackend(name="templateless", has_chat_template=False)
        return ChatSession(SpeculativeEngine(target), GenerationSettings(max_tokens=5), seed=0)

    monkeypatch.setattr(chatapp.assembly.loader, "build_session", fake_session)
    assert main(["run", "-k", "0", "hello"]) == 0
    err = capsys.readouterr().err
    assert "note: templateless has no usable chat template" in err and "ChatML" in err
