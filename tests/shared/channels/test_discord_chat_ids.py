"""Discord bot messages put the chat id into the URL path: only a snowflake (digits) may go there, or
`../guilds/...` given to the `message` tool (send_to `discord:*`) would reach other API endpoints."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shared.channels.base import Rejected
from shared.channels.discord import DiscordChannel
from shared.settings import Settings
from tests.fakes.server import ThreadServer


class Recorder:
    """Any path, any method: records the path and answers as Discord answers a sent message."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.server = ThreadServer(Starlette(routes=[
            Route("/{rest:path}", self._any, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])]))

    async def _any(self, request: Request) -> JSONResponse:
        with self.lock:
            self.paths.append(request.url.path)
        return JSONResponse({"id": "1"})

    def taken(self) -> list[str]:
        with self.lock:
            paths, self.paths = self.paths, []
        return paths


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    rec.server.start()
    yield rec
    rec.server.stop()


def channel(recorder: Recorder) -> DiscordChannel:
    return DiscordChannel(Settings(channels={"discord": {
        "application_id": "1", "public_key": "00" * 32, "bot_token": "bot-token", "api_base": recorder.server.url}}))


def test_a_path_in_the_chat_id_is_refused_for_good_without_a_request(recorder: Recorder) -> None:
    ch = channel(recorder)
    for bad in ("../guilds/1/members/2", "1/../../guilds/1", "123?x=1", "123#x", "", " 123", "12 3", "١٢٣"):
        with pytest.raises(Rejected, match="not a Discord channel id"):
            ch.send(bad, "hi", {})
    assert recorder.taken() == []
    assert ch.send("123456789012345678", "hi", {}).platform_message_id == "1"
    assert recorder.taken() == ["/channels/123456789012345678/messages"]


@settings(max_examples=200, deadline=None)
@given(chat_id=st.one_of(st.text(max_size=30), st.from_regex(r"[0-9]{1,20}", fullmatch=True)))
def test_only_snowflakes_reach_the_api(recorder: Recorder, chat_id: str) -> None:
    ch = channel(recorder)
    snowflake = chat_id.isascii() and chat_id.isdigit() and len(chat_id) <= 20
    try:
        ch.send(chat_id, "hi", {})
    except Rejected:
        assert not snowflake, chat_id
        assert recorder.taken() == []
        return
    assert snowflake, chat_id
    assert recorder.taken() == [f"/channels/{chat_id}/messages"]
