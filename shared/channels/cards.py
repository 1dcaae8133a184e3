"""What a person shares that is neither text nor a file, a location or a contact card, as text the
model reads (such a message used to get the notice that only text is read): a place's name, address
and coordinates; a contact's name, phone numbers and email addresses; a dice roll. And the line that
tells the model of what came with a message's text that it cannot see (a video under its caption),
lest it answer as if it had seen it."""

from __future__ import annotations

import math


def location(latitude: object, longitude: object, name: object = None, address: object = None) -> str | None:
    """The place as the model reads it; None when its coordinates are not a place on Earth."""
    try:
        lat, lon = float(str(latitude)), float(str(longitude))
    except ValueError:
        return None
    if not (math.isfinite(lat) and math.isfinite(lon) and abs(lat) <= 90 and abs(lon) <= 180):
        return None
    place = "; ".join(_words(part) for part in (name, address) if _words(part))
    return f"[The user shared a location: {place + '; ' if place else ''}latitude {lat:.6f}, longitude {lon:.6f}]"


def contact(name: object, phones: list[object], emails: list[object]) -> str | None:
    """The contact card as the model reads it; None when it holds nothing."""
    details = [_words(d) for d in [*phones, *emails] if _words(d)]
    who = _words(name)
    if not (who or details):
        return None
    return f"[The user shared a contact: {who or 'no name'}{': ' + ', '.join(details) if details else ''}]"


def dice(emoji: object, value: object) -> str | None:
    """A roll of Telegram's animated dice (🎲, 🎯, 🏀...) as the model reads it; None when malformed."""
    if not (isinstance(emoji, str) and isinstance(value, int)):
        return None
    return f"[The user rolled {_words(emoji) or 'a die'}: {value}]"


def unseen(what: str, text: str) -> str:
    """`text` (a caption) after the line saying `what` ("a video") came with it, unseen by the model."""
    return f"[The user sent {what} with this message; you cannot see it.]\n{text}"


def _words(value: object) -> str:
    """A text field as one line ("" for anything else): a name cannot break the bracket it is in."""
    return " ".join(value.split()).replace("[", "(").replace("]", ")") if isinstance(value, str) else ""
