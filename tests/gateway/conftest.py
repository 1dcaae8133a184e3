"""Gateway test fixtures: the chat platform stack (tests/support/platforms.py)."""

from tests.support.platforms import channel_stack, channels  # noqa: F401
