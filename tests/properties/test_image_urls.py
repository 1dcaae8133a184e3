"""The API's image data URLs: the pattern its schema publishes and the validator it runs agree, so a
client (or schemathesis) that writes to the schema is not refused, and real images of every type pass."""

from __future__ import annotations

import base64
import re

from hypothesis import given
from hypothesis import strategies as st

from gateway.schemas import IMAGE_URL, decoded_image

MAGIC = {"png": st.just(b"\x89PNG\r\n\x1a\n"), "jpeg": st.just(b"\xff\xd8\xff"),
         "gif": st.sampled_from([b"GIF87a", b"GIF89a"]),
         "webp": st.binary(min_size=4, max_size=4).map(lambda size: b"RIFF" + size + b"WEBP")}


@given(st.from_regex(IMAGE_URL, fullmatch=True))
def test_what_the_schema_allows_the_validator_accepts(url: str) -> None:
    decoded_image(url, "images[0]")


@given(st.sampled_from(sorted(MAGIC)).flatmap(lambda kind: st.tuples(st.just(kind), MAGIC[kind])),
       st.binary(min_size=1, max_size=64))
def test_every_image_a_model_takes_fits_the_schema(kind_magic: tuple[str, bytes], rest: bytes) -> None:
    kind, magic = kind_magic
    url = f"data:image/{kind};base64,{base64.b64encode(magic + rest).decode()}"
    assert re.fullmatch(IMAGE_URL, url)
    assert decoded_image(url, "images[0]") == magic + rest
