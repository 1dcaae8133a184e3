"""The Celery app Flower runs (`celery -A workers.flower:app flower`): the workers' app on kombu's
own Redis transport, whose `redis://` and `redis+socket://` URLs Flower's broker view (queue lengths)
understands; ours report themselves as `shared.broker:Transport://` or `socket://`, which Flower
cannot read.

Flower's API revokes tasks and shuts workers down behind basic auth alone: a login of
FLOWER_BASIC_AUTH (`user:password[,user2:password2]`) with an empty part or a password from an
example stops it here, as compose's entrypoint does (which also wants it set)."""

from __future__ import annotations

import os

from shared.broker import kombu_config
from shared.settings import SHIPPED_PASSWORDS, get_settings
from workers.app import app


def login_problem(logins: str) -> str | None:
    """What is wrong with FLOWER_BASIC_AUTH's logins, or None."""
    for pair in logins.split(","):
        user, colon, password = pair.partition(":")
        if not colon:
            return "must be user:password (several: a comma between them)"
        if not user or not password.strip():
            return "has an empty user or password"
        if password.strip().lower() in SHIPPED_PASSWORDS:
            return f"has a password from an example anyone can read ('{password}')"
    return None


if (logins := os.environ.get("FLOWER_BASIC_AUTH")) and (problem := login_problem(logins)):
    raise SystemExit(f"nanofleet: FLOWER_BASIC_AUTH {problem}; refusing to start Flower. Set user:password "
                     "(a password of your own)")
app.conf.update(kombu_config(get_settings().redis_url))

__all__ = ["app"]
