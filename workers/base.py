"""The task base: retryable errors, and a database connection lost under a task (a restart, a
failover), become Celery retries with backoff; others are logged."""

from __future__ import annotations

import random
from typing import Any

from celery import Task
from sqlalchemy.exc import DBAPIError

from shared.errors import Retryable


class NanofleetTask(Task):  # type: ignore[misc]
    """Maps shared.errors.Retryable to a Celery retry honouring its delay."""

    max_retries = 8

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Retryable as err:
            delay = err.delay if err.delay is not None else self.backoff()
            raise self.retry(exc=err, countdown=delay, max_retries=err.max_retries or self.max_retries) from err
        except DBAPIError as err:
            if not err.connection_invalidated:
                raise
            # Every task is safe to run again (steps check what is written; tool calls have a journal).
            raise self.retry(exc=err, countdown=self.backoff(), max_retries=self.max_retries) from err

    def backoff(self) -> float:
        """Exponential backoff with full jitter, capped at five minutes."""
        attempt = self.request.retries or 0
        return float(random.uniform(0, min(300.0, 2.0 ** (attempt + 1))))
