"""What a model that is not shown a message's photos reads in their place: a line naming them. The
prompt writes it for earlier turns' photos and for a model that sees none (shared.agent.prompt); the
LLM client, for a fallback model that sees none when the prompt was built for one that does."""

from __future__ import annotations

from typing import Any

NOT_SHOWN = "[{n} photo(s) sent with this message, not shown here]"


def named(text: str, photos: int) -> str:
    """A message's text after the line naming its photos."""
    return f"{NOT_SHOWN.format(n=photos)}\n{text}".rstrip()


def without_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages with each one's image parts named instead of shown (the rest as they are)."""
    out = []
    for m in messages:
        parts = m.get("content")
        parts = parts if isinstance(parts, list) else []
        if photos := sum(p.get("type") == "image_url" for p in parts):
            text = "\n".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
            m = {**m, "content": named(text, photos)}
        out.append(m)
    return out
