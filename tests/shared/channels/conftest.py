"""Channel test fixtures: the chat platform stack (tests/support/platforms.py), and a Redis database
of the module's own for the platform modules that keep state there (tokens, bot info, claims)."""

from collections.abc import Iterator

import pytest

from tests.support import services
from tests.support.platforms import channel_stack, channels  # noqa: F401


@pytest.fixture(scope="module")
def redis_url(redis_server: str) -> Iterator[str]:
    with services.claimed_redis_dbs(redis_server, 1) as (db,):
        yield f"{redis_server}/{db}"
