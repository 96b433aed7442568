"""The reply's Markdown with provenance (chatapp/tui/markdown_text.py), without widgets: what is
shown, which tint lies on each shown character, streaming against rendering at once."""

from __future__ import annotations

import random

import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text

from chatapp.chat.events import TokenSource
from chatapp.tui.markdown_inline import InlineStyles
from chatapp.tui.markdown_text import MarkdownRenderer, MarkdownStyles, render_markdown

A, R, B, T = TokenSource.ACCEPTED, TokenSource.RESAMPLED, TokenSource.BONUS, TokenSource.TARGET
TINTS = {A: "#203020", R: "#403010", B: "#102040", T: "#303030"}
BOLD, ITALIC, CODE = Style(bold=True), Style(italic=True), Style(color="cyan")
H1, BULLET, LABEL = Style(color="magenta", bold=True), Style(color="yellow"), Style(dim=True)


def styles(provenance: bool = True) -> MarkdownStyles:
    tints = {source: (Style(bgcolor=TINTS[source]) if provenance else Style())
             + Style(meta={"token": source.value}) for source in TokenSource}
    return MarkdownStyles(
        headings=(H1, Style(bold=True)),
        inline=InlineStyles(bold=BOLD, italic=ITALIC, strike=Style(strike=True), code=CODE,
                            link=Style(underline=True)),
        bullet=BULLET, quote=Style(italic=True), rule=Style(dim=True), label=LABEL,
        syntax_theme="monokai", tints=tints)


def tints_of(text: Text) -> list[str | None]:
    """The source of each shown character, from its tint span (exactly one per character)."""
    sources: list[str | None] = [None] * len(text)
    for span in text.spans:
        if span.style.meta:
            for index in range(span.start, span.end):
                assert sources[index] is None, "two tints on one character"
                sources[index] = span.style.meta["token"]
    return sources


CONSOLE = Console(color_system="truecolor")


def look(text: Text, index: int) -> Style:
    """The style of one shown character, its tint included."""
    return text.get_style_at_offset(CONSOLE, index)


def stream(runs, parts: int, seed: int = 0, provenance: bool = True) -> Text:
    """``runs`` appended in about ``parts`` random groups, each run cut at random places."""
    rng = random.Random(seed)
    pieces = []
    for text, source in runs:
        cuts = sorted({0, len(text), *rng.sample(range(len(text) + 1), min(2, len(text)))})
        pieces += [(text[a:b], source) for a, b in zip(cuts, cuts[1:]) if b > a]
    renderer = MarkdownRenderer(styles(provenance))
    size = max(1, len(pieces) // parts)
    for start in range(0, len(pieces), size):
        renderer.append(pieces[start:start + size])
    return renderer.text


def test_a_heading_loses_its_markers_and_keeps_each_tokens_tint():
    text = render_markdown([("# ", A), ("Spec", R), ("ulative", B), (" ##\n", T), ("x", A)],
                           styles())
    assert text.plain == "Speculative\nx"
    assert tints_of(text) == ["resampled"] * 4 + ["bonus"] * 7 + ["target", "accepted"]
    assert look(text, 0).bold and look(text, 0).bgcolor.name == TINTS[R]
    assert look(text, 5).bgcolor.name == TINTS[B] and look(text, 5).color.name == "magenta"


def test_list_items_get_bullets_that_keep_the_tint_of_their_marker():
    text = render_markdown([("- ", A), ("one\n", B), ("* two\n", R), ("  1. ", T), ("three", A)],
                           styles())
    assert text.plain == "• one\n• two\n  1. three"
    assert tints_of(text) == (["accepted"] * 2 + ["bonus"] * 4 + ["resampled"] * 6
                              + ["target"] * 5 + ["accepted"] * 5)
    assert look(text, 0).color.name == "yellow" and look(text, 6).color.name == "yellow"


def test_inline_markers_are_dropped_and_tints_stay_on_their_characters():
    runs = [("a **b", A), ("old** and *it", R), ("* and `co", B), ("de` \\*x\\*", T)]
    text = render_markdown(runs, styles())
    assert text.plain == "a bold and it and code *x*"
    assert tints_of(text) == (["accepted"] * 3 + ["resampled"] * 10 + ["bonus"] * 7
                              + ["target"] * 6)
    assert look(text, 3).bold and not look(text, 7).bold
    assert look(text, 11).italic and look(text, 19).color.name == "cyan"


def test_a_code_block_shows_each_tokens_tint_on_exactly_its_characters_and_syntax_colours():
    runs = [("```py", A), ("thon\n", B), ("def", R), (" f", T), ("(x):\n    return", A),
            (" x\n```\n", B), ("after", T)]
    text = render_markdown(runs, styles())
    assert text.plain == "python\ndef f(x):\n    return x\nafter"
    assert tints_of(text) == (["accepted"] * 2 + ["bonus"] * 5 + ["resampled"] * 3
                              + ["target"] * 2 + ["accepted"] * 15 + ["bonus"] * 3
                              + ["target"] * 5)
    assert look(text, 0).dim  # the language, as a dim label
    keyword, name = look(text, 7), look(text, 11)  # "def" and "f"
    assert keyword.color != name.color and keyword.color is not None
    assert keyword.bgcolor.name == TINTS[R] and name.bgcolor.name == TINTS[T]


def test_quotes_rules_links_and_a_fence_without_a_language():
    runs = [("> quo", A), ("ted\n", R), ("---\n", B), ("[site](http://x.org)\n", T),
            ("~~~\ncode\n~~~\n", A)]
    text = render_markdown(runs, styles())
    assert text.plain == "▌ quoted\n" + "─" * 40 + "\nsite\ncode\n"
    sources = tints_of(text)
    assert sources[:9] == ["accepted"] * 5 + ["resampled"] * 4
    assert set(sources[9:50]) == {"bonus"}  # the rule's line takes its marker's tint
    assert look(text, 51).underline and look(text, 51).link == "http://x.org"


@pytest.mark.parametrize("partial, shown", [
    ("```python\ndef f(", "python\ndef f("),  # an open fence: code so far
    ("```python\nx = 1\n``", "python\nx = 1\n"),  # a closing fence on its way is not code
    ("```python print(s[::-1])", "python print(s[::-1])"),  # code on the fence's line: shown
    ("```python app/x.py\nx = 1", "python app/x.py\nx = 1"),  # an attached file's path
    ("some **bold", "some **bold"),  # ** shown as it is until closed
    ("some *it", "some *it"),
    ("some `co", "some `co"),
    ("#", ""),  # a heading so far
])
def test_partial_markdown_while_streaming(partial, shown):
    text = render_markdown([(partial, A)], styles())
    assert text.plain == shown


def test_an_open_fence_is_highlighted_as_code_so_far():
    text = render_markdown([("```python\ndef f(", A)], styles())
    assert look(text, 7).color is not None and look(text, 7).color != look(text, 11).color


def test_emphasis_closes_when_its_marker_arrives():
    renderer = MarkdownRenderer(styles())
    renderer.append([("some **bo", A)])
    assert renderer.text.plain == "some **bo"
    renderer.append([("ld** end", R)])
    assert renderer.text.plain == "some bold end"
    assert look(renderer.text, 5).bold and not look(renderer.text, 10).bold


REPLY = [("# Title\n\nSome ", A), ("**bold** text and `code`", R), (" here.\n\n", B),
         ("- one\n- two *it", A), ("* more\n  continued\n> quote\n", T),
         ("```python\nfor i in range(3):\n", A), ("    print(i)  # \x1b[31m\r", R),
         ("\n```\n\n## Next\n---\n1. a\n2. b", B), ("\n\n```\nplain\n", T)]


@pytest.mark.parametrize("parts", [1, 2, 5, 30, 1000])
@pytest.mark.parametrize("provenance", [True, False])
def test_streaming_in_pieces_gives_the_same_text_as_rendering_at_once(parts, provenance):
    at_once = render_markdown(REPLY, styles(provenance))
    for seed in range(3):
        streamed = stream(REPLY, parts, seed, provenance)
        assert streamed.plain == at_once.plain
        assert streamed.spans == at_once.spans


def test_completed_blocks_are_rendered_once():
    renderer = MarkdownRenderer(styles())
    rendered: list[str] = []
    original = renderer.render_block

    def counting(block):
        rendered.append(renderer.source[block.start:block.end])
        return original(block)

    renderer.render_block = counting
    for text, source in REPLY:
        for char in text:
            renderer.append([(char, source)])
    assert renderer.text.plain == render_markdown(REPLY, styles()).plain
    # The title's block was rendered while it streamed, then kept: never again once the
    # reply moved on (each append renders only the last one or two blocks).
    assert rendered.count("# Title\n") <= 2
    assert max(len(block) for block in rendered) <= len("```python\nfor i in range(3):\n"
                                                         "    print(i)  # ␛[31m\n\n```\n")


def test_control_characters_are_shown_as_symbols():
    text = render_markdown([("a\x1b[31m", A), ("\x07b\r", R), ("\nc\x00 **d\x9b**", B)],
                           styles())
    assert text.plain == "a␛[31m␇b\nc␀ d\ufffd"
    assert tints_of(text) == ["accepted"] * 6 + ["resampled"] * 3 + ["bonus"] * 5


def test_without_provenance_the_markdown_is_the_same_and_untinted():
    tinted, plain = render_markdown(REPLY, styles()), render_markdown(REPLY, styles(False))
    assert tinted.plain == plain.plain
    assert all(look(plain, i).bgcolor is None for i in range(len(plain)))
    assert tints_of(plain) == tints_of(tinted)  # the meta stays for what reads it
    assert [look(plain, i).color for i in range(len(plain))] == [
        look(tinted, i).color for i in range(len(tinted))]


def test_a_tool_call_shows_folded_as_its_name_and_arguments() -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    text = render_markdown([("Let me look.\n\n", TokenSource.TARGET), (call, TokenSource.ACCEPTED),
                            ("Done.", TokenSource.TARGET)], styles())
    assert text.plain == 'Let me look.\n\n▸ tool call get_weather {"city": "Paris"}\nDone.'
    streaming = render_markdown([("<tool_call>\n{\"name\": \"get_w", TokenSource.TARGET)],
                                styles())
    assert streaming.plain == "▸ tool call …"
