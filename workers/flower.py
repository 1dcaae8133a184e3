"""The Celery app Flower runs (`celery -A workers.flower:app flower`): the workers' app on kombu's
own Redis transport, whose `redis://` and `redis+socket://` URLs Flower's broker view (queue lengths)
understands; ours report themselves as `shared.broker:Transport://` or `socket://`, which Flower
cannot read."""

from __future__ import annotations

from shared.broker import kombu_config
from shared.settings import get_settings
from workers.app import app

app.conf.update(kombu_config(get_settings().redis_url))

__all__ = ["app"]
