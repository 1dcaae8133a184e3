"""/healthz, /readyz and `nanofleet status` against real Redis, Postgres and real workers."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from gateway.status import NOT_TAKEN
from shared.constants import BEAT_LOCK
from shared.db import get_engine
from tests.support.databases import database_in, reason
from tests.support.processes import ROOT, last_line_printed, wait_until
from tests.support.stack import Stack, answers, api_client, gateway_process


def test_healthz_and_readyz_with_a_worker(stack: Stack, api, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    assert api.get("/healthz").json() == {"status": "ok"}
    with caplog.at_level(logging.INFO):
        ready = api.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["workers"] >= 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("alembic")] == []  # two lines a check were


def test_readyz_names_redis_when_it_is_down(make_stack: Callable[..., Stack]) -> None:
    s = make_stack(REDIS_URL="redis://127.0.0.1:1/0")
    for client in api_client(s.settings):
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "redis" in ready.json()["failing"]
        assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("state", ["empty", "behind", "ahead"])
def test_readyz_names_a_database_not_at_this_codes_revision(state: str, make_stack: Callable[..., Stack]) -> None:
    with database_in(state) as url:
        s = make_stack(DATABASE_URL=url)
        for client in api_client(s.settings):
            ready = client.get("/readyz")
    if state == "ahead":  # a newer nanofleet migrated it: this one goes on serving through the upgrade
        assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
    else:
        assert ready.status_code == 503 and "database" in ready.json()["failing"]
        assert ready.json()["checks"]["database"] == reason(state)


def test_readyz_shows_workers_and_stays_ready_when_none_runs(make_stack: Callable[..., Stack]) -> None:
    """The gateway still takes messages in while every worker restarts (a deploy); a load balancer
    that took it out then made platforms' webhooks fail, and Discord does not send them again."""
    s = make_stack()
    for client in api_client(s.settings):
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["workers"] == "none answering" and ready.json()["failing"] == []


def test_api_needs_a_bearer_key(stack: Stack) -> None:
    for client in api_client(stack.settings):
        assert client.get("/api/v1/tools", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/api/v1/tools", headers={"Authorization": ""}).status_code == 401
        assert client.get("/api/v1/tools").status_code == 200


def test_a_flood_of_readiness_checks_leaves_the_gateway_answering(make_stack: Callable[..., Stack]) -> None:
    """/readyz needs no key. It broadcast a worker ping per request, each holding a broker connection
    while it waited for a second one from the same pool: 40 callers for a few seconds took the whole
    pool and then waited forever, and the gateway answered nothing more, not even /healthz."""
    s = make_stack()
    s.worker(queues="scheduler", concurrency=1)
    with gateway_process(s) as (_, client):
        stop = time.monotonic() + 6

        def hammer() -> set[int]:
            seen = set()
            with httpx.Client(base_url=client.base_url, timeout=10) as own:
                while time.monotonic() < stop:
                    try:
                        seen.add(own.get("/readyz").status_code)
                    except httpx.HTTPError as err:
                        seen.add(-1)
                        if isinstance(err, httpx.TimeoutException):
                            return seen
            return seen

        with ThreadPoolExecutor(40) as pool:
            statuses = set().union(*pool.map(lambda _: hammer(), range(40)))
        assert answers(client), "the gateway stopped answering"
        assert client.post("/api/v1/conversations").status_code == 200
        assert 200 in statuses and statuses <= {200, 503}, statuses  # 503: the first count still awaited


def _status_once(s: Stack, done: Callable[[subprocess.CompletedProcess[str]], bool]) -> Callable[[], Any]:
    """A poll for wait_until: `nanofleet status`'s run once `done` holds of it."""
    def poll() -> subprocess.CompletedProcess[str] | None:
        run = subprocess.run([sys.executable, "-m", "gateway.cli", "status"], env=s.env, capture_output=True,
                             text=True, timeout=60)
        return run if done(run) else None
    return poll


def test_status_names_a_queue_no_worker_takes_and_a_beat_that_is_not_running(
        make_stack: Callable[..., Stack]) -> None:
    """With beat stopped, or a queue no worker took, `status` said all was well (operator's review)."""
    s = make_stack()
    s.worker(queues="scheduler", concurrency=1)
    done = wait_until(_status_once(s, lambda run: "1 alive" in run.stdout), timeout=60,
                      message="the worker to answer")
    assert done.returncode == 1, done.stdout
    assert f"queue      agent      0 waiting{NOT_TAKEN}" in done.stdout
    assert "queue      scheduler  0 waiting\n" in done.stdout
    assert f"beat       NOT RUNNING: nobody holds {BEAT_LOCK}" in done.stdout
    assert "failures   0 replies dead-lettered (GET /api/v1/outbox?status=failed), 0 inbound messages set aside" \
        in done.stdout
    with get_engine(s.settings.database_url).begin() as conn:  # what waits for the operator is counted
        conn.execute(text("insert into outbox (id, key, channel, chat_id, content, meta, status, attempts, created_at) "
                          "values ('o1', 'k:0', 'telegram', '42', 'hi', '{}', 'failed', 5, now())"))
        conn.execute(text("insert into inbound_events (channel, event_id, received_at, set_aside, failures) "
                          "values ('telegram', 'e1', now(), '{}', 5), ('telegram', 'e2', now(), '{}', 5)"))
    s.worker(queues="agent,tools,subagents,outbound", concurrency=2)
    s.beat()
    done = wait_until(_status_once(s, lambda run: run.returncode == 0), timeout=60,
                      message="status to find every queue taken and beat running")
    assert "beat       ok" in done.stdout and "NO WORKER" not in done.stdout
    assert "failures   1 reply dead-lettered (GET /api/v1/outbox?status=failed), 2 inbound messages set aside" \
        in done.stdout


def test_status_names_each_mcp_server_and_its_state(make_stack: Callable[..., Stack]) -> None:
    """An MCP server's state was only in the workers' logs: `status` said nothing of a broken one."""
    demo = {"command": sys.executable, "args": ["-m", "tests.support.mcp_server"], "cwd": str(ROOT)}
    servers = {"demo": demo, "broken": {"command": "/nonexistent/mcp-server"}}
    s = make_stack(TOOLS__MCP_SERVERS=json.dumps(servers))
    s.worker(concurrency=2)
    s.beat()
    done = wait_until(_status_once(s, lambda run: "1 alive" in run.stdout and "beat       ok" in run.stdout),
                      timeout=60, message="the worker and beat to be seen")
    assert isinstance(done, subprocess.CompletedProcess)
    assert "mcp        demo: ok (5 tools)\n" in done.stdout, done.stdout
    assert "mcp        broken: DOWN: FileNotFoundError: [Errno 2] No such file or directory" in done.stdout
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr  # all is well but the server


def test_status_without_mcp_servers_does_not_import_the_sdk() -> None:
    code = ("import sys; from shared.settings import Settings; from gateway.status import _mcp_lines; "
            "assert _mcp_lines(Settings(), print); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types') "
            "or m.startswith('shared.tools'))[:3])")
    assert last_line_printed(code) == "[]"


def test_the_api_docs_load_nothing_from_outside(make_stack: Callable[..., Stack]) -> None:
    """/docs (Swagger UI) and /redoc come with their scripts and styles: an air-gapped deployment has
    no CDN. Every asset a page names is served here, and nothing names another host."""
    import re

    s = make_stack()
    for client in api_client(s.settings):
        assert client.get("/openapi.json").json()["info"]["title"] == "nanofleet"
        for page in ("/docs", "/redoc"):
            html = client.get(page)
            assert html.status_code == 200 and html.headers["content-type"].startswith("text/html"), page
            assert "http://" not in html.text and "https://" not in html.text, (page, html.text)
            assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text) + re.findall(
                r"""url: ['"]([^'"]+)['"]""", html.text)
            assert any(a.endswith(".js") for a in assets), (page, assets)
            for asset in assets:
                got = client.get(asset)
                assert got.status_code == 200 and got.content, (page, asset, got.status_code)
        assert client.get("/docs/oauth2-redirect").status_code == 200


def test_healthz_answers_while_readiness_checks_wait_on_a_database_that_never_answers(
        make_stack: Callable[..., Stack]) -> None:
    """/healthz ran in the same thread pool as /readyz: a database that takes connections and never
    answers held every thread for its connect timeout, and the liveness check waited behind them
    (an orchestrator would then restart a gateway that was only waiting)."""
    s = make_stack()
    held: list[socket.socket] = []
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(200)
        silent.settimeout(0.2)

        def take() -> None:  # accept, and never say a word
            while silent.fileno() != -1:
                with contextlib.suppress(OSError):
                    held.append(silent.accept()[0])

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        s.env["NANOFLEET_DATABASE_URL"] = f"postgresql+psycopg://nanofleet:pw@127.0.0.1:{silent.getsockname()[1]}/x"
        with gateway_process(s) as (_, hanging), ThreadPoolExecutor(60) as pool:
            count = len(held)
            waiting = [pool.submit(httpx.get, f"{hanging.base_url}/readyz", timeout=30) for _ in range(60)]
            wait_until(lambda: len(held) >= count + 40, timeout=20,
                       message="the readiness checks to fill the gateway's thread pool")
            started = time.monotonic()
            assert hanging.get("/healthz", timeout=5).json() == {"status": "ok"}
            assert time.monotonic() - started < 2
            assert {f.result().status_code for f in waiting} == {503}
    for conn in held:
        conn.close()
