"""Locations and contact cards (shared.channels.cards) as the model reads them, and as each platform
sends them (parsed by the channel, in-process)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.channels import cards
from shared.channels.feishu import FeishuChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings
from tests.fakes.feishu import FakeFeishu
from tests.fakes.telegram import FakeTelegram
from tests.fakes.whatsapp import FakeWhatsApp

S = Settings(channels={"telegram": {"bot_username": "nanofleet_bot"}, "feishu": {"encrypt_key": "k"},
                       "whatsapp": {"phone_number_id": "P1"}})
EIFFEL = "[The user shared a location: Eiffel Tower; Champ de Mars, Paris; latitude 48.858400, longitude 2.294500]"


def body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def test_a_place_and_a_contact_as_the_model_reads_them() -> None:
    assert cards.location("48.8584", 2.2945, "Eiffel Tower", "Champ de Mars,\nParis") == EIFFEL  # (one line)
    assert cards.location(0, 0) == "[The user shared a location: latitude 0.000000, longitude 0.000000]"
    assert cards.contact("Ann [work]", ["+33 6 12", None, ""], ["ann@x.io"]) == \
        "[The user shared a contact: Ann (work): +33 6 12, ann@x.io]"  # (a bracket cannot end it early)
    assert cards.contact(None, ["+1 555"], []) == "[The user shared a contact: no name: +1 555]"


@pytest.mark.parametrize("latitude, longitude", [(None, 1), ("north", 1), (91, 0), (0, 181), ("nan", 0), (True, 0)])
def test_what_is_no_place_is_no_card(latitude: object, longitude: object) -> None:
    assert cards.location(latitude, longitude) is None
    assert cards.contact(" ", [], [None]) is None


def test_telegram_locations_venues_and_contacts_in_private_chats() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)

    def parsed(chat: int = 5, chat_type: str = "private", **message: Any) -> list[Any]:
        update = tg.update(chat=chat, sender=1, text="", chat_type=chat_type, **message)
        del update["message"]["text"]
        return ch.parse({}, body(update)).messages

    point = {"latitude": 48.8584, "longitude": 2.2945}
    [venue] = parsed(location=point, venue={"location": point, "title": "Eiffel Tower",
                                            "address": "Champ de Mars, Paris"})
    assert (venue.content, venue.unsupported) == (EIFFEL, None)
    [pin] = parsed(location=point)
    assert pin.content == "[The user shared a location: latitude 48.858400, longitude 2.294500]"
    [person] = parsed(contact={"phone_number": "+33612", "first_name": "Ann", "last_name": "Lee"})
    assert person.content == "[The user shared a contact: Ann Lee: +33612]"
    assert parsed(chat=-7, chat_type="group", location=point) == []  # addressed to nobody
    [broken] = parsed(location={"latitude": "x"})
    assert (broken.content, broken.unsupported) == ("", "a location")  # the notice, as before


def test_whatsapp_locations_and_contacts() -> None:
    wa, ch = FakeWhatsApp("t", "s", "P1"), WhatsAppChannel(S)
    payload = wa.event(sender="155501", text="x", wamid="wamid.1")
    value = payload["entry"][0]["changes"][0]["value"]
    value["messages"] = [
        {"from": "155501", "id": "wamid.1", "type": "location", "location": {
            "latitude": 48.8584, "longitude": 2.2945, "name": "Eiffel Tower", "address": "Champ de Mars, Paris"}},
        {"from": "155501", "id": "wamid.2", "type": "contacts", "contacts": [
            {"name": {"formatted_name": "Ann Lee"}, "phones": [{"phone": "+33612", "type": "CELL"}],
             "emails": [{"email": "ann@x.io"}]},
            {"name": "not an object", "phones": "nor a list"}]},
        {"from": "155501", "id": "wamid.3", "type": "location", "location": {}}]
    parsed = ch.parse({}, body(payload)).messages
    assert [(m.content, m.unsupported) for m in parsed] == [
        (EIFFEL, None), ("[The user shared a contact: Ann Lee: +33612, ann@x.io]", None), ("", "a location")]


def test_feishu_locations() -> None:
    fs, ch = FakeFeishu("cli", "s", "tok", "k"), FeishuChannel(S)
    event = fs.event(chat="oc_1", sender="ou_1", text="x", event_id="ev1")
    event["event"]["message"].update(message_type="location", content=json.dumps(
        {"name": "Eiffel Tower", "latitude": "48.8584", "longitude": "2.2945"}))
    [place] = ch.parse({}, fs.signed(event)[0]).messages
    assert (place.content, place.unsupported) == (
        "[The user shared a location: Eiffel Tower; latitude 48.858400, longitude 2.294500]", None)
