"""Chat platform webhooks end to end: fake platforms on loopback, the gateway over HTTP, a real
worker, the fake LLM. For every platform: one valid event -> exactly one reply; forged or stale
signatures -> 401 and nothing stored; the same event three times (and concurrently) -> one turn;
a denied sender -> nothing; a 429 -> delivered once."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text as sql
from sqlmodel import Session

from shared.agent import conversations
from shared.agent.service import HELP, SENDING_COMMANDS
from shared.channels.discord import NOT_OURS
from shared.channels.images import UNSEEN, UNSEEN_SOME
from shared.channels.inbound import UNSEEN_IMAGE, UNSUPPORTED
from shared.db import get_engine
from tests.fakes.llm import FakeLLM
from tests.support.platforms import DRIVERS, ChannelStack, llm_requests_with
from tests.support.processes import wait_until

PLATFORMS = list(DRIVERS)


def marker() -> str:
    return f"hello-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("name", PLATFORMS)
def test_a_valid_event_gets_exactly_one_reply(channels: ChannelStack, fake_llm: FakeLLM, name: str) -> None:
    d, chat, text = channels.driver(name), channels.driver(name).new_chat(), marker()
    r = channels.post(name, d.request(chat=chat, text=text))
    assert r.status_code == 200, r.text
    assert r.json() == d.accepted
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {text}"]
    assert llm_requests_with(fake_llm, text) == 1
    assert channels.fakes[name].refused == []


@pytest.mark.parametrize("name", PLATFORMS)
def test_forged_or_stale_signatures_are_refused_and_nothing_is_stored(
    channels: ChannelStack, fake_llm: FakeLLM, name: str
) -> None:
    d, chat, text = channels.driver(name), channels.driver(name).new_chat(), marker()
    for label, req in d.forgeries(chat, text).items():
        r = channels.post(name, req)
        assert r.status_code == 401, (label, r.status_code, r.text)
    assert channels.scalar("select count(*) from inbound_events") == 0
    assert channels.stored(text) == 0
    assert llm_requests_with(fake_llm, text) == 0


@pytest.mark.parametrize("name", PLATFORMS)
def test_the_same_event_three_times_is_one_turn_and_one_reply(
    channels: ChannelStack, fake_llm: FakeLLM, name: str
) -> None:
    d = channels.driver(name)
    chat, text = d.new_chat(), marker()
    req = d.request(chat=chat, text=text)
    assert [channels.post(name, req).status_code for _ in range(3)] == [200, 200, 200]
    chat2, text2 = d.new_chat(), marker()
    req2 = d.request(chat=chat2, text=text2)
    start = threading.Barrier(3)

    def post() -> int:
        start.wait()
        return channels.post(name, req2).status_code

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(lambda _: post(), range(3))) == [200, 200, 200]
    for c, t in ((chat, text), (chat2, text2)):
        channels.settled(c)
        assert d.replies(c) == [f"echo: {t}"]
        assert llm_requests_with(fake_llm, t) == 1
        assert channels.scalar("select count(*) from runs r join conversations c on c.id = r.conversation_id "
                               "where c.chat_id = :c", c=c) == 1
    assert channels.scalar("select count(*) from inbound_events") == 2


@pytest.mark.parametrize("name", PLATFORMS)
def test_a_denied_sender_gets_no_reply_and_costs_no_llm_call(
    channels: ChannelStack, fake_llm: FakeLLM, name: str
) -> None:
    d, chat, text = channels.driver(name), channels.driver(name).new_chat(), marker()
    r = channels.post(name, d.request(chat=chat, text=text, sender=d.denied))
    assert r.status_code == 200, r.text
    if name == "discord":  # every interaction needs an answer: a private "not allowed"
        assert r.json()["type"] == 4 and r.json()["data"]["flags"] == 64
    assert channels.stored(text) == 0
    assert channels.scalar("select count(*) from outbox") == 0
    assert llm_requests_with(fake_llm, text) == 0
    assert d.replies(chat) == []


# (Discord: an empty /ask is told how to ask; Slack's apps send no blank message)
@pytest.mark.parametrize("name", [p for p in PLATFORMS if p not in ("discord", "slack")])
def test_a_blank_message_costs_no_llm_call_and_gets_no_reply(channels: ChannelStack, fake_llm: FakeLLM,
                                                            name: str) -> None:
    """An empty or blank text (Feishu sends one; a private Feishu message that only mentioned the bot
    was one once the mention was cut) went to the model as an empty user message: "echo: " came back.
    A mention alone calls the bot, as on Telegram and Slack: it is answered."""
    d, calls = channels.driver(name), fake_llm.calls()
    chat = d.new_chat()
    for text in ("", "   ", "\n\t"):
        assert channels.post(name, d.request(chat=chat, text=text)).status_code in (200, 400)
    assert channels.post(name, d.request(chat=chat, text="and now?")).status_code == 200
    channels.settled(chat)  # (a message is taken in after those before it in its chat)
    assert d.replies(chat) == ["echo: and now?"] and fake_llm.calls() == calls + 1
    if name == "feishu":
        fs = channels.fakes["feishu"]
        only = fs.event(chat=chat, sender=d.allowed, text="@_user_1", event_id=uuid.uuid4().hex,
                        mentions=[fs.mention(1)])
        assert channels.post(name, fs.signed(only)).status_code == 200
        channels.settled(chat, rows=2)
        assert d.replies(chat)[-1] == f"echo: @{fs.bot_name}"


@pytest.mark.parametrize("name", PLATFORMS)
def test_a_429_is_retried_and_the_reply_delivered_once(channels: ChannelStack, name: str) -> None:
    d, chat, text = channels.driver(name), channels.driver(name).new_chat(), marker()
    d.rate_limit()
    assert channels.post(name, d.request(chat=chat, text=text)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {text}"]
    assert [c.status for c in channels.fakes[name].arrived(chat)] == [429, 200]
    assert channels.scalar("select attempts from outbox where chat_id = :c", c=chat) == 0  # throttled, not failed


def test_a_message_that_meets_its_conversations_deletion_starts_a_new_one(channels: ChannelStack) -> None:
    """The chat's conversation is being deleted (DELETE /api/v1/conversations/{id}, not committed
    yet) when a message from that chat arrives: it waits for the deletion and starts the chat
    afresh, instead of a 500 and the platform's retries."""
    d = channels.driver("telegram")
    chat, first, second = d.new_chat(), marker(), marker()
    assert channels.post("telegram", d.request(chat=chat, text=first)).status_code == 200
    channels.settled(chat)
    cid = channels.scalar("select id from conversations where chat_id = :c", c=chat)
    with Session(get_engine(channels.database_url)) as deleting, ThreadPoolExecutor(1) as pool:
        conversations.delete_conversation(deleting, cid)
        answer = pool.submit(channels.post, "telegram", d.request(chat=chat, text=second))
        wait_until(lambda: answer.done() or channels.scalar(
            "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()"),
            timeout=30, message="the webhook to meet the deletion")
        deleting.commit()
        assert answer.result(30).status_code == 200, answer.result().text
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {first}", f"echo: {second}"]
    assert channels.scalar("select count(*) from conversations where chat_id = :c and id <> :old", c=chat, old=cid) == 1


# --------------------------------------------------------------------------- platform specifics


def test_slack_url_verification_answers_the_challenge_only_when_signed(channels: ChannelStack) -> None:
    slack = channels.fakes["slack"]
    payload = {"token": "x", "challenge": "c-123", "type": "url_verification"}
    assert channels.post("slack", slack.signed(payload)).json() == {"challenge": "c-123"}
    assert channels.post("slack", slack.signed(payload, secret="wrong")).status_code == 401


def test_slack_replies_in_the_thread_and_keeps_one_session_per_thread(channels: ChannelStack) -> None:
    slack, d = channels.fakes["slack"], channels.driver("slack")
    chat = d.new_chat()
    first = slack.event(channel=chat, user=d.allowed, text="<@UBOT0001> one", event_id="Ev1")
    root = first["event"]["ts"]
    channels.post("slack", slack.signed(first))
    channels.settled(chat)
    in_thread = slack.event(channel=chat, user=d.allowed, text="<@UBOT0001> two", event_id="Ev2", thread_ts=root)
    other = slack.event(channel=chat, user=d.allowed, text="<@UBOT0001> three", event_id="Ev3")
    channels.post("slack", slack.signed(in_thread))
    channels.post("slack", slack.signed(other))
    channels.settled(chat, rows=3)
    calls = slack.sent(chat)
    assert [c.body["text"] for c in calls if c.body.get("thread_ts") == root] == ["echo: one", "echo: two"]
    assert channels.scalar("select count(*) from conversations where chat_id = :c", c=chat) == 2
    ignored = [slack.event(channel=chat, user=d.allowed, text="mine", event_id="Ev4", bot_id="B1"),
               slack.event(channel=chat, user=d.allowed, text="chatter", event_id="Ev5", kind="message",
                           channel_type="channel")]
    for payload in ignored:
        assert channels.post("slack", slack.signed(payload)).status_code == 200
    assert channels.scalar("select count(*) from messages where content in ('mine', 'chatter')") == 0


def test_slack_help_says_how_to_send_a_command_there(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """Slack takes a message that starts with / for a command of its own: /help listed ours bare."""
    slack, d = channels.fakes["slack"], channels.driver("slack")
    chat = d.new_chat()
    channels.post("slack", slack.signed(slack.event(channel=chat, user=d.allowed, text="<@UBOT0001> /help",
                                                    event_id="EvHelp")))
    channels.settled(chat)
    [reply] = [c.body["text"] for c in slack.sent(chat)]
    assert "/stop" in reply and reply.endswith(SENDING_COMMANDS["slack"].replace(">", "&gt;")), reply
    assert llm_requests_with(fake_llm, "/help") == 0


def test_a_whatsapp_reply_reported_failed_later_becomes_a_dead_letter_that_can_be_resent(
    channels: ChannelStack,
) -> None:
    wa, d = channels.fakes["whatsapp"], channels.driver("whatsapp")
    chat = d.new_chat()
    channels.post("whatsapp", d.request(chat=chat, text=marker()))
    channels.settled(chat)
    wamid = channels.scalar("select platform_message_id from outbox where chat_id = :c", c=chat)
    for status in ("sent", "delivered", "read"):
        assert channels.post("whatsapp", wa.signed(wa.status(recipient=chat, wamid=wamid, status=status))).json() \
            == {"ok": True}
    assert channels.scalar("select status from outbox where chat_id = :c", c=chat) == "delivered"
    failed = wa.signed(wa.status(recipient=chat, wamid=wamid, status="failed"))
    assert channels.post("whatsapp", failed).status_code == 200
    assert channels.post("whatsapp", failed).status_code == 200  # Meta may report it twice
    [row] = [r for r in channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()
             if r["chatId"] == chat]
    assert row["platformMessageId"] == wamid and "131047" in row["lastError"]
    assert channels.post("whatsapp", wa.signed(wa.status(recipient=chat, wamid="wamid.unknown",
                                                         status="failed"))).status_code == 200
    assert channels.api.post(f"/api/v1/outbox/{row['id']}/retry").status_code == 202
    wait_until(lambda: len(d.replies(chat)) == 2, timeout=30, message="the reply sent again")
    # the worker records the send once the platform has answered it: a moment after the fake got it
    wait_until(lambda: channels.scalar("select status from outbox where chat_id = :c", c=chat) == "delivered",
               timeout=30, message="the resend recorded as delivered")
    assert channels.scalar("select platform_message_id from outbox where chat_id = :c", c=chat) != wamid


def test_a_whatsapp_failure_reported_before_the_send_was_recorded_is_not_lost(channels: ChannelStack) -> None:
    """Meta may report a failure while our worker is still marking the send delivered: the report
    waits for the mark."""
    wa, d = channels.fakes["whatsapp"], channels.driver("whatsapp")
    chat = d.new_chat()
    early = wa.signed(wa.status(recipient=chat, wamid=wa.next_wamid(), status="failed", code=131026,
                                title="Message undeliverable"))
    assert channels.post("whatsapp", early).status_code == 200
    channels.post("whatsapp", d.request(chat=chat, text=marker()))
    wait_until(lambda: channels.scalar("select status from outbox where chat_id = :c", c=chat) == "failed",
               timeout=30, message="the reply marked failed")
    assert "131026" in channels.scalar("select last_error from outbox where chat_id = :c", c=chat)


def test_a_whatsapp_reply_keeps_its_emphasis_in_whatsapp_s_marks(channels: ChannelStack) -> None:
    """Replies went out as plain text, their bold and italics dropped."""
    d = channels.driver("whatsapp")
    chat = d.new_chat()
    channels.post("whatsapp", d.request(chat=chat, text="**bold**, _it_ and ~~old~~"))
    channels.settled(chat)
    assert d.replies(chat) == ["echo: *bold*, _it_ and ~old~"]


def test_a_feishu_reply_is_a_post_feishu_renders_or_else_text(channels: ChannelStack) -> None:
    """Replies went out as text, their markdown dropped; a post Feishu refuses still gets through."""
    fs, d = channels.fakes["feishu"], channels.driver("feishu")
    chat = d.new_chat()
    channels.post("feishu", d.request(chat=chat, text="see:\n# Plan\n**bold** and `code`"))
    channels.settled(chat)
    assert d.replies(chat) == ["echo: see:\n**Plan**\n**bold** and `code`"]  # (a heading it would show as written)
    assert [c.body["msg_type"] for c in fs.sent(chat)] == ["post"]
    fs.refuse_posts = True
    chat = d.new_chat()
    channels.post("feishu", d.request(chat=chat, text="**again**"))
    channels.settled(chat)
    assert d.replies(chat) == ["echo: **again**"]
    assert [c.body["msg_type"] for c in fs.sent(chat)] == ["text"]


def test_whatsapp_get_verification(channels: ChannelStack) -> None:
    params = {"hub.mode": "subscribe", "hub.verify_token": "wa-verify-token", "hub.challenge": "1158201444"}
    r = channels.http.get("/webhooks/whatsapp", params=params)
    assert r.status_code == 200 and r.text == "1158201444"
    assert channels.http.get("/webhooks/whatsapp", params={**params, "hub.verify_token": "no"}).status_code == 403


def test_feishu_encrypted_url_verification_and_a_cached_refreshed_tenant_token(channels: ChannelStack) -> None:
    feishu, d = channels.fakes["feishu"], channels.driver("feishu")
    challenge = {"challenge": "ch-1", "token": feishu.verification_token, "type": "url_verification"}
    assert channels.post("feishu", feishu.signed(challenge, signed=False)).json() == {"challenge": "ch-1"}
    wrong = {**challenge, "token": "nope"}
    assert channels.post("feishu", feishu.signed(wrong, signed=False)).status_code == 401
    chat = d.new_chat()
    for text in ("one", "two"):
        channels.post("feishu", d.request(chat=chat, text=text))
        channels.settled(chat, rows=1 if text == "one" else 2)
    assert feishu.token_calls() == 1
    feishu.revoke_tokens()
    channels.post("feishu", d.request(chat=chat, text="three"))
    channels.settled(chat, rows=3)
    assert d.replies(chat) == ["echo: one", "echo: two", "echo: three"]
    assert feishu.token_calls() == 2


def test_feishu_throttling_answered_as_http_400_is_retried(channels: ChannelStack) -> None:
    """Feishu says "too many requests" with HTTP 400 and code 99991400, not with a 429."""
    feishu, d = channels.fakes["feishu"], channels.driver("feishu")
    feishu.script("im.message.create", 400, {"code": 99991400, "msg": "request trigger frequency limit"},
                  headers={"x-ogw-ratelimit-reset": "0"}, times=2)
    chat, text = d.new_chat(), marker()
    channels.post("feishu", d.request(chat=chat, text=text))
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {text}"]
    assert [c.status for c in feishu.arrived(chat)] == [400, 400, 200]
    assert channels.scalar("select attempts from outbox where chat_id = :c", c=chat) == 0


def test_discord_ping_and_the_deferred_flow(channels: ChannelStack) -> None:
    discord, d = channels.fakes["discord"], channels.driver("discord")
    assert channels.post("discord", discord.signed({"id": "1", "type": 1, "application_id": "APP1"})).json() == {
        "type": 1}
    chat = d.new_chat()
    payload = discord.command(channel=chat, user=d.allowed, text="sleep:0.5 question", interaction_id="I1")
    r = channels.post("discord", discord.signed(payload))
    assert r.json() == {"type": 5}
    assert discord.sent(chat) == []  # the answer comes later, by editing the deferred response
    channels.settled(chat)
    [call] = discord.sent(chat)
    assert call.op == "edit_original" and call.path.endswith(f"/{payload['token']}/messages/@original")
    assert call.body["content"] == "echo: sleep:0.5 question"


def test_a_feishu_group_message_is_answered_only_when_it_mentions_the_bot(
    channels: ChannelStack, fake_llm: FakeLLM
) -> None:
    """The app may read every group message; one that @-mentions someone else is not for the bot,
    whatever it starts with. The bot's open_id is asked of Feishu (bot/v3/info)."""
    feishu, d = channels.fakes["feishu"], channels.driver("feishu")
    group, for_bob, for_us = d.new_chat(), marker(), marker()
    bob = feishu.mention(1, open_id="ou_bob", name="Bob")
    events = [feishu.event(chat=group, sender=d.allowed, text=f"@_user_1 {for_bob}", event_id=marker(),
                           chat_type="group", mentions=[bob]),
              feishu.event(chat=group, sender=d.allowed, text=f"@_user_1 @_user_2 {for_us}", event_id=marker(),
                           chat_type="group", mentions=[bob, feishu.mention(2)])]
    for event in events:
        assert channels.post("feishu", feishu.signed(event)).status_code == 200
    channels.settled(group)
    assert d.replies(group) == [f"echo: @Bob {for_us}"]  # Bob is named; the bot's own mention is dropped
    assert channels.stored(for_bob) == 0 and llm_requests_with(fake_llm, for_bob) == 0
    assert channels.scalar("select count(*) from inbound_events") == 1  # the other one costs nothing
    assert feishu.refused == []


def lock_waits(channels: ChannelStack) -> int:
    return int(channels.scalar("select count(*) from pg_stat_activity "
                               "where wait_event_type = 'Lock' and datname = current_database()"))


def test_discord_is_answered_in_time_while_the_database_is_slow_and_the_message_still_processed_once(
    channels: ChannelStack, fake_llm: FakeLLM
) -> None:
    """Discord fails an interaction unanswered after 3 s and never sends it again: its deferred answer
    goes out while its event still waits to be recorded, which then happens (one turn, one reply).
    Telegram, which sends an unanswered update again, is still answered only after the durable write."""
    dc, tg = channels.driver("discord"), channels.driver("telegram")
    chat, tg_chat, said, tg_text = dc.new_chat(), tg.new_chat(), marker(), marker()
    with Session(get_engine(channels.database_url)) as locker, ThreadPoolExecutor(2) as pool:
        locker.execute(sql("lock table inbound_events in exclusive mode"))  # every ledger write now waits
        telegram = pool.submit(channels.post, "telegram", tg.request(chat=tg_chat, text=tg_text))
        wait_until(lambda: lock_waits(channels) == 1, timeout=30, message="Telegram's write to wait on the lock")
        discord = pool.submit(channels.post, "discord", dc.request(chat=chat, text=said))
        try:
            wait_until(discord.done, timeout=20, message="Discord's answer while the database is blocked")
            assert discord.result().status_code == 200 and discord.result().json() == {"type": 5}
            assert lock_waits(channels) == 1  # Telegram's write still waits; Discord's event is queued for the next
            assert not telegram.done()  # posted first, but answered only once its update is stored
        finally:
            locker.commit()
        assert telegram.result(30).status_code == 200
    for driver, c, t in ((dc, chat, said), (tg, tg_chat, tg_text)):
        channels.settled(c)
        assert driver.replies(c) == [f"echo: {t}"]
        assert llm_requests_with(fake_llm, t) == 1
    assert channels.scalar("select count(*) from inbound_events") == 2


def test_discord_components_autocomplete_and_modals_get_valid_answers(channels: ChannelStack) -> None:
    """Each interaction needs an interaction response; {"ok": true} is none, and the user would see
    "interaction failed"."""
    discord = channels.fakes["discord"]
    base = {"application_id": discord.application_id, "token": "itk-x", "version": 1, "channel_id": "C1",
            "member": {"user": {"id": "1001", "username": "ann"}}}
    on_message = {"message": {"id": "M1", "channel_id": "C1"}}  # a modal opened from a button of a message
    kinds = {"3": (3, {}), "4": (4, {}), "5": (5, {}), "5 from a button": (5, on_message)}
    answers = {name: channels.post("discord", discord.signed({**base, "id": f"I{name}", "type": kind, **extra,
                                                               "data": {"custom_id": "b1", "name": "ask"}}))
               for name, (kind, extra) in kinds.items()}
    assert {name: (r.status_code, r.json()) for name, r in answers.items()} == {
        "3": (200, {"type": 6}),  # a button or menu: acknowledged, its message left as it is
        "4": (200, {"type": 8, "data": {"choices": []}}),  # autocomplete: no choices to offer
        # a modal opened by a slash command has no message to leave as it is: its submitter is told
        "5": (200, {"type": 4, "data": {"content": NOT_OURS, "flags": 64}}),
        "5 from a button": (200, {"type": 6}),
    }
    assert channels.scalar("select count(*) from inbound_events") == 0


def test_telegram_group_mentions_typing_and_commands(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    group = "-" + d.new_chat()
    plain = tg.update(chat=int(group), sender=1001, text="just chatting", chat_type="group")
    assert channels.post("telegram", tg.signed(plain)).status_code == 200
    mention = tg.update(chat=int(group), sender=1001, text="@nanofleet_bot sleep:1.5 ping", chat_type="group")
    assert channels.post("telegram", tg.signed(mention)).status_code == 200
    channels.settled(group)
    [call] = tg.sent(group)
    assert call.body["text"] == "echo: sleep:1.5 ping"
    assert call.body["reply_parameters"]["message_id"] == mention["message"]["message_id"]
    with fake_llm.lock:  # the model is told who spoke in the group
        [asked] = [b["messages"] for b in fake_llm.requests if "sleep:1.5 ping" in json.dumps(b)]
    sender = mention["message"]["from"]
    name = f"{sender.get('username') or sender['first_name']} (1001)"
    assert {"role": "user", "content": f"[{name}]: sleep:1.5 ping"} in asked
    assert f"sender: {name} (a group chat)" in asked[-1]["content"]
    assert any(c.op == "sendChatAction" and c.body["chat_id"] == group for c in tg.calls)
    assert channels.scalar("select count(*) from messages where content = 'just chatting'") == 0
    chat = d.new_chat()
    channels.post("telegram", d.request(chat=chat, text="/help"))
    channels.settled(chat)
    assert d.replies(chat) == [HELP.replace("<", "&lt;").replace(">", "&gt;")]
    assert llm_requests_with(fake_llm, "/help") == 0


def test_a_long_paste_telegram_split_is_one_message(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """Telegram's apps send a paste past 4096 characters as several messages: the first was answered
    before the rest had come (no debounce is set here)."""
    d, calls = channels.driver("telegram"), fake_llm.calls()
    chat, first = d.new_chat(), "\n".join(["log line"] * 450)
    for part in (first, "the end of the log"):
        assert channels.post("telegram", d.request(chat=chat, text=part)).status_code == 200
    channels.settled(chat)
    assert channels.scalar("select json_agg(m.content) from messages m join conversations c on "
                           "c.id = m.conversation_id where c.chat_id = :c and m.role = 'USER'", c=chat) == \
        [first + "\nthe end of the log"]
    assert fake_llm.calls() == calls + 1


def test_where_no_model_sees_images_a_photo_s_caption_goes_on_saying_so(channels: ChannelStack,
                                                                       fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    update = tg.photo(chat=int(chat), sender=int(d.allowed), image=b"\xff\xd8\xff photo", caption="what is this?")
    assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {UNSEEN}what is this?"]
    assert tg.downloads == []  # not fetched for nobody


def test_where_no_model_sees_images_an_album_is_one_message_that_says_how_many(channels: ChannelStack,
                                                                              fake_llm: FakeLLM) -> None:
    """Each photo of an album used to get its own answer: the caption's, then a notice per photo."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    for i in range(3):
        update = tg.photo(chat=int(chat), sender=int(d.allowed), image=b"\xff\xd8\xff photo",
                          caption="what are these?" if i == 1 else None, album=f"album-{chat}")
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    wait_until(lambda: channels.scalar("select count(*) from inbound_events where message is not null") == 0,
               message="the album submitted")
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {UNSEEN_SOME.format(n=3)}what are these?"]


def test_whatsapp_marks_the_message_read_and_shows_typing_while_a_turn_runs(channels: ChannelStack,
                                                                             fake_llm: FakeLLM) -> None:
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number = w.new_chat()
    request = w.request(chat=number, text="sleep:2.5 ping")
    wamid = json.loads(request[0])["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    assert channels.post("whatsapp", request).status_code == 200
    channels.settled(number)
    assert w.replies(number) == ["echo: sleep:2.5 ping"]
    typing = [c for c in wa.calls if c.op == "typing" and c.body.get("message_id") == wamid]
    assert len(typing) == 1 and typing[0].status == 200  # once: it lasts 25 s, and the turn 2.5
    assert wa.refused == []


def test_a_shared_location_reaches_the_model(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """It got the notice that only text is read; "what is near me?" needs it."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    berlin = {"latitude": 52.52, "longitude": 13.405}
    update = tg.update(chat=int(chat), sender=int(d.allowed), text="", location=berlin)
    del update["message"]["text"]
    assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == ["echo: [The user shared a location: latitude 52.520000, longitude 13.405000]"]


def test_a_voice_message_or_photo_gets_a_notice_and_no_llm_call(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """Without text for the model, a person in a private chat is told so, once, instead of silence."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    voice = tg.signed(tg.update(chat=int(chat), sender=int(d.allowed), text="", voice={"file_id": "v1", "duration": 3}))
    for _ in range(2):  # and Telegram's retry of it
        assert channels.post("telegram", voice).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [UNSUPPORTED.format(what="a voice message")]
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number = w.new_chat()
    photo = wa.event(sender=number, text="", wamid=f"wamid.{marker()}")
    photo["entry"][0]["changes"][0]["value"]["messages"][0].update(type="image", image={"id": "m1"})
    del photo["entry"][0]["changes"][0]["value"]["messages"][0]["text"]
    assert channels.post("whatsapp", wa.signed(photo)).status_code == 200
    channels.settled(number)
    assert w.replies(number)[-1] == UNSEEN_IMAGE  # (not "only text": files such as PDFs are read)
    assert channels.scalar("select count(*) from runs r join conversations c on c.id = r.conversation_id "
                           "where c.chat_id in (:a, :b)", a=chat, b=number) == 0
    assert fake_llm.calls() == 0


def test_telegram_typing_for_a_turn_started_from_the_mailbox(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """A message that waits behind a running turn starts its own turn when that one ends, from the
    worker: it shows "typing..." too, once, as the first did."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, first, second = d.new_chat(), marker(), marker()
    assert channels.post("telegram", d.request(chat=chat, text=f"sleep:1.5 {first}")).status_code == 200
    wait_until(lambda: llm_requests_with(fake_llm, first) == 1, timeout=30, message="the first turn's LLM call")
    assert channels.post("telegram", d.request(chat=chat, text=f"sleep:1.5 {second}")).status_code == 200
    channels.settled(chat, rows=2)
    assert d.replies(chat) == [f"echo: sleep:1.5 {first}", f"echo: sleep:1.5 {second}"]
    assert channels.scalar("select count(*) from runs r join conversations c on c.id = r.conversation_id "
                           "where c.chat_id = :c", c=chat) == 2  # the second turn came from the mailbox
    typing = [c for c in tg.calls if c.op == "sendChatAction" and c.body["chat_id"] == chat]
    assert len(typing) == 2  # one per turn: each lasts ~1.5 s, typing starts at 1 s and renews every 4.5 s


def test_a_quick_reply_shows_no_typing(channels: ChannelStack) -> None:
    """"typing..." is for a turn that takes a while: a reply within a second spends no API call on it."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    quick, slow = d.new_chat(), d.new_chat()
    assert channels.post("telegram", d.request(chat=quick, text="hello")).status_code == 200
    assert channels.post("telegram", d.request(chat=slow, text="sleep:1.5 hello")).status_code == 200
    for chat in (quick, slow):
        channels.settled(chat)
    wait_until(lambda: channels.scalar("select count(*) from runs r join conversations c on c.id = r.conversation_id "
                                       "where c.chat_id = :c and r.finished_at < now() - interval '1.5 seconds'",
                                       c=quick) == 1, timeout=10, message="the quick turn's typing delay to pass")
    # the quick turn's typing task has had its second by now; the slow one's ran while it was going
    wait_until(lambda: any(c.op == "sendChatAction" and c.body["chat_id"] == slow for c in tg.calls), timeout=10,
               message="the slow turn's typing")
    assert not any(c.op == "sendChatAction" and c.body["chat_id"] == quick for c in tg.calls)


def test_bodies_too_big_malformed_or_unknown(channels: ChannelStack) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    big = b'{"update_id": 1, "pad": "' + b"x" * (1024 * 1024) + b'"}'
    assert channels.post("telegram", (big, tg.signed({})[1])).status_code == 413
    assert channels.post("telegram", (b"not json", tg.signed({})[1])).status_code == 400
    edited = {"update_id": 77, "edited_message": {"text": "x"}}
    assert channels.post("telegram", tg.signed(edited)).json() == {"ok": True}
    wh = channels.fakes["webhook"]
    assert channels.post("webhook", wh.signed({"id": "x", "text": "no chat"})).status_code == 400
    assert channels.scalar("select count(*) from inbound_events") == 0
    assert d.replies(d.new_chat()) == []


def test_a_platform_without_its_secrets_is_off(channels: ChannelStack) -> None:
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from shared.channel_settings import ChannelsSettings

    bare = channels.stack.settings.model_copy(update={"channels": ChannelsSettings()})
    with TestClient(create_app(bare)) as client:
        r = client.post("/webhooks/telegram", content=json.dumps({"update_id": 1}))
        assert r.status_code == 404
        assert "NANOFLEET_CHANNELS__TELEGRAM__TOKEN" in r.json()["detail"]


def test_a_large_unsigned_body_is_checked_off_the_event_loop(channels: ChannelStack,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Feishu's verification token is read from the JSON: a 1 MB body nobody signed is parsed before it
    is refused, which on the event loop would hold every request and stream of the process meanwhile."""
    from shared.channels.feishu import FeishuChannel

    on_loop: list[bool] = []
    verify = FeishuChannel.verify

    def recording(self: FeishuChannel, headers: dict[str, str], body: bytes) -> None:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        verify(self, headers, body)

    monkeypatch.setattr(FeishuChannel, "verify", recording)
    small = json.dumps({"token": "forged", "type": "url_verification", "challenge": "c"}).encode()
    large = json.dumps({"token": "forged", "pad": "x" * 1_000_000}).encode()
    for body in (small, large):
        answer = channels.http.post("/webhooks/feishu", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 401, answer.text
    assert on_loop == [True, False]  # a small body stays on the loop: a thread hop costs every event


def test_a_lone_surrogate_in_a_message_is_taken_as_a_replacement_character(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """JSON may spell a lone UTF-16 surrogate, which Postgres cannot store: the message is taken with
    U+FFFD in its place, not refused with a 500 (which the platform would send again and again)."""
    d, chat, text = channels.driver("telegram"), channels.driver("telegram").new_chat(), marker()
    r = channels.post("telegram", d.request(chat=chat, text=f"{text} \ud800!"))
    assert r.status_code == 200, r.text
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {text} \ufffd!"]


def test_where_no_model_sees_images_a_post_s_text_goes_on_counting_its_photos(channels: ChannelStack) -> None:
    fs, d = channels.fakes["feishu"], channels.driver("feishu")
    chat = d.new_chat()
    post = fs.post(chat=chat, sender=d.allowed, event_id=uuid.uuid4().hex,
                   paragraphs=[[{"tag": "text", "text": "what are these?"}]], images=(b"\xff\xd8\xff a", b"b"))
    assert channels.post("feishu", fs.signed(post)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {UNSEEN_SOME.format(n=2)}what are these?"]
    assert [c for c in fs.calls if c.op == "im.message.resource"] == []  # not fetched for nobody


def test_retry_in_a_discord_chat_answers_in_the_retry_s_own_interaction(channels: ChannelStack) -> None:
    """The answer goes where /retry was sent: on Discord, its own interaction's "thinking..." (the first
    interaction was answered already, and its token may have expired)."""
    dc, d = channels.fakes["discord"], channels.driver("discord")
    chat = d.new_chat()
    for text, rows in (("hello", 1), ("/retry", 2)):
        assert channels.post("discord", d.request(chat=chat, text=text)).status_code == 200
        channels.settled(chat, rows=rows)
    sent = dc.sent(chat)
    assert [(c.op, dc.text_of(c)) for c in sent] == [("edit_original", "echo: hello")] * 2
    assert sent[0].path != sent[1].path  # two interactions, each answered once
    cid = channels.scalar("select id from conversations where chat_id = :c", c=chat)
    assert channels.scalar("select count(*) from messages where conversation_id = :c and role = 'ASSISTANT'",
                           c=cid) == 1
