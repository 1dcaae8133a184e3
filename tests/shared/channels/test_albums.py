"""Albums (shared.channels.albums), in-process: how an album's items become one message."""

from __future__ import annotations

from typing import Any

from shared.channels import albums, images
from shared.channels.base import MAX_IMAGES
from shared.contracts import InboundMessage

PHOTO = {"mime": "image/png", "data": "iVBO"}


def item(n: int, caption: str = "", **kw: Any) -> InboundMessage:
    fields: dict[str, Any] = {"media": {"kind": "photo", "id": f"p{n}"}, "unsupported": None if caption else "a photo"}
    return InboundMessage(channel="telegram", chat_id="5", sender_id="1", content=caption, event_id=str(n),
                          album="a1", **{**fields, **kw})


def test_the_items_captions_and_photos_go_in_order_fetched_or_not() -> None:
    fetched = item(2, media=None, unsupported=None, images=[PHOTO])  # (fetched ahead of its submission)
    one = albums.merged([item(1), fetched, item(3, "which?"), item(4, "and why")])
    assert (one.event_id, one.content, one.unsupported, one.notice) == ("1", "which?\n\nand why", None, None)
    assert (one.media, one.images, one.more_media) == ({"kind": "photo", "id": "p1"}, [PHOTO],
                                                       [{"kind": "photo", "id": "p3"}, {"kind": "photo", "id": "p4"}])
    alone = albums.merged([item(1), item(2)])  # no caption: still what a photo alone is, until fetched
    assert (alone.content, alone.unsupported, len(alone.more_media)) == ("", "a photo", 1)
    unseen = images.unseen(alone)  # (for a model that sees none: its sender is told so, once)
    assert (unseen.unsupported, unseen.media, unseen.more_media) == ("a photo", None, [])


def test_the_model_is_told_of_what_it_is_not_given() -> None:
    many = albums.merged([item(n, "look" if n == 1 else "") for n in range(1, MAX_IMAGES + 3)])
    assert len(many.more_media) == MAX_IMAGES - 1
    assert many.content == "look\n\n" + albums.PASSED_OVER.format(n=2, limit=MAX_IMAGES)
    film = item(2, media=None, unsupported="a video")
    assert albums.merged([item(1, "look"), film]).content == "look\n\n" + albums.NOT_READ.format(n=1)
    films = albums.merged([film, item(3, media=None, unsupported="a video")])
    assert (films.content, films.unsupported, films.event_id) == ("", "a video", "2")  # one notice, not one each


def test_an_item_that_could_not_be_read_is_told_to_the_model_unless_nothing_else_is_read() -> None:
    """One unreadable item used to give the whole album its notice: the caption and the other items lost."""
    failed = item(2, "[file big.pdf: not read, it is too large]").answered("Sorry, I couldn't get your file")
    one = albums.merged([item(1, "look"), failed, item(3)])
    assert (one.notice, one.content) == (None, "look\n\n[file big.pdf: not read, it is too large]")
    assert [one.media, *one.more_media] == [{"kind": "photo", "id": "p1"}, {"kind": "photo", "id": "p3"}]
    scan = item(4, media=None, unsupported=None).answered("Sorry, I couldn't read scan.pdf")  # (a notice alone)
    assert albums.merged([item(1, "look"), scan]).content == "look\n\n" + albums.UNREAD_ITEM.format(
        notice="Sorry, I couldn't read scan.pdf")
    alone = albums.merged([failed, scan])  # nothing else to read: the sender's notice, once
    assert alone.notice == "Sorry, I couldn't get your file"


def test_only_the_items_the_model_is_given_are_fetched() -> None:
    """Every item used to be fetched and kept, the model then shown the saved places of photos it was
    told it was not given."""
    prepared: list[str] = []

    def prepare(one: InboundMessage) -> InboundMessage:
        prepared.append(one.event_id)
        return one.model_copy(update={"media": None, "unsupported": None, "content": f"[photo {one.event_id}]"})

    many = [item(n, "and this" if n == MAX_IMAGES + 2 else "", follower=n == 1) for n in range(1, MAX_IMAGES + 3)]
    one = albums.merged(many, prepare)
    assert prepared == [str(n) for n in range(2, MAX_IMAGES + 2)]  # (the follower last: past the limit)
    assert one.content == "\n\n".join([*(f"[photo {n}]" for n in range(2, MAX_IMAGES + 2)), "and this",
                                        albums.PASSED_OVER.format(n=2, limit=MAX_IMAGES)])
    assert (one.media, one.more_media, one.unsupported) == (None, [], None)


def test_in_a_group_the_album_is_the_addressed_item_s_with_the_followers_after_it() -> None:
    items = [item(1, follower=True), item(2, "@bot which?", reply_meta={"reply_to_message_id": 2}),
             item(3, follower=True)]
    one = albums.merged(items)
    assert albums.addressed(items)
    assert (one.event_id, one.content, one.reply_meta, one.follower) == ("2", "@bot which?", {"reply_to_message_id": 2},
                                                                          False)
    assert [one.media, *one.more_media] == [{"kind": "photo", "id": f"p{n}"} for n in (2, 1, 3)]
    assert not albums.addressed([item(1, follower=True), item(2, follower=True)])  # taken in by nobody
