"""Searching every chat from the chats screen (ctrl+o, then /): results show the chat's title and
the matching line with its words highlighted, Enter opens the chat at that message, Esc clears
the search. Fake backends."""

from __future__ import annotations

from textual.widgets import Input, OptionList

from chatapp.tui.chats_screen import ChatListScreen
from chatapp.tui.widgets import MessageView
from tests.conftest import ready, reply_done, send, wait_for

SIZE = (120, 40)


async def chat(pilot, *texts: str) -> int:
    """A new chat of ``texts`` (each answered); its id."""
    await pilot.press("ctrl+n")
    for text in texts:
        await send(pilot, text)
        await reply_done(pilot)
    return pilot.app.chat.chat_id


async def search(pilot, text: str) -> ChatListScreen:
    await pilot.press("ctrl+o")
    await pilot.pause()
    await pilot.press("slash", *text)
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, ChatListScreen)
    return screen


def options(screen: ChatListScreen) -> list:
    listed = screen.query_one(OptionList)
    return [listed.get_option_at_index(i) for i in range(listed.option_count)]


async def test_a_search_finds_a_message_in_another_chat_and_opens_it_there(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        wanted = await chat(pilot, "where is the purple elephant", *[f"filler {n}" for n in
                                                                      range(8)])
        await chat(pilot, "something about bananas")
        screen = await search(pilot, "eleph")
        search_box = screen.query_one("#chat-search", Input)
        assert search_box.value == "eleph" and isinstance(app.screen, ChatListScreen)
        (hit,) = options(screen)
        shown = hit.prompt
        assert shown.plain == ("where is the purple elephant\n"
                               "  You: where is the purple elephant")
        marked = [shown.plain[s.start:s.end] for s in shown.spans if "reverse" in str(s.style)]
        assert marked == ["elephant"]
        message_id = app.chat.history.messages(wanted)[0].id
        assert hit.id == f"{wanted}:{message_id}"
        await pilot.press("enter", "enter")  # to the results, then open
        await pilot.pause()
        assert app.chat.chat_id == wanted
        selected = app.message_list.selected
        assert isinstance(selected, MessageView) and selected.entry.message_id == message_id
        await wait_for(pilot, lambda: app.message_list.scroll_y == 0, what="the scroll")
        assert app.message_list.max_scroll_y > 0  # the chat is longer than the screen


async def test_typing_in_the_search_box_never_runs_the_list_keys_and_esc_clears_it(
        tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        kept = await chat(pilot, "a chat to keep")
        screen = await search(pilot, "nerd/")  # n new, e export, r rename, d delete, / search
        assert screen.query_one("#chat-search", Input).value == "nerd/"
        assert app.screen is screen and app.chat.chats.exists(kept)
        (nothing,) = options(screen)
        assert nothing.disabled and "No message matches" in str(nothing.prompt)
        await pilot.press("escape")  # clears the search: the chats again
        await pilot.pause()
        assert app.screen is screen and screen.query_one("#chat-search", Input).value == ""
        assert [option.id for option in options(screen)] == [str(kept)]
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ChatListScreen)


async def test_a_reply_word_is_found_and_results_follow_the_typing(tui_make_app):
    app = tui_make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first = await chat(pilot, "alpha question")
        second = await chat(pilot, "alpha again", "beta")
        screen = await search(pilot, "alpha")
        assert sorted(int(o.id.partition(":")[0]) for o in options(screen)) == [first, second]
        assert "2 messages found" in str(screen.query_one("#chats-status").render())
        await pilot.press("space", *"again")
        await pilot.pause()
        assert [o.id.partition(":")[0] for o in options(screen)] == [str(second)]
        reply = app.chat.history.messages(second)[1]
        word = next(w for w in reply.content.split() if w.isalpha() and len(w) > 3)
        screen.query_one("#chat-search", Input).value = word
        await pilot.pause()
        assert f"{second}:{reply.id}" in [o.id for o in options(screen)]
