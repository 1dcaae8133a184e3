"""The Celery app Flower runs (`celery -A workers.flower:app flower`): the workers' app on kombu's
own Redis transport, whose `redis://` URL Flower's broker view (queue lengths) understands; ours
reports itself as `shared.broker:Transport://`, which Flower cannot read."""

from __future__ import annotations

from workers.app import app

app.conf.broker_transport = None

__all__ = ["app"]
