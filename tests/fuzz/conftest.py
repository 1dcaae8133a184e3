"""Fuzzing fixtures: the chat platform stack from tests/support/platforms.py."""

from tests.support.platforms import channel_stack, channels  # noqa: F401
