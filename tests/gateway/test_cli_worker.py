"""`nanofleet worker` refuses what it was not built for, naming what it takes, before starting Celery."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gateway.cli import app


@pytest.mark.parametrize(("args", "named"), [
    (["--pool", "gevent"], "unknown pool 'gevent'; known: threads, prefork, solo"),
    (["--queues", "agent,nope"], "unknown queue(s) nope"),
])
def test_worker_refuses_an_unknown_pool_or_queue(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["worker", *args])
    assert result.exit_code == 2 and named in result.output
