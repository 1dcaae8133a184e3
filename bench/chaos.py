"""`make chaos` / `make chaos-smoke`: a Jepsen-style run. Inbound messages across many chats (each
Telegram webhook delivered 3 times) while a controller SIGKILLs workers and restarts the gateway,
beat, a dedicated Redis and a dedicated Postgres; then drain and count, per message, replies
(lost = 0, duplicated = 0), tool executions (re-executed = 0), subagents and cron firings.
Exits 1 on any loss or duplicate."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import text

from bench.chaos_check import Received, Tally, collect, handler, window_resends
from bench.chaos_faults import Controller
from bench.chaos_load import Traffic
from bench.chaos_report import render
from bench.fakes import FakeTelegram
from bench.report import BENCH_DIR
from bench.services import DedicatedPostgres, DedicatedRedis, free_port
from bench.stack import BenchStack, Teardown, bench_defaults, child_env
from shared.db import get_engine
from shared.migrate import upgrade
from tests.fakes.llm import FakeLLM
from tests.support.stack import make_env

SINGLES = [(0.2, "gateway"), (0.35, "beat"), (0.5, "redis"), (0.65, "postgres")]
QUIESCENT = """
select (select count(*) from runs where status in ('queued', 'running'))
     + (select count(*) from messages where pending)
     + (select count(*) from outbox where status = 'pending')
     + (select count(*) from cron_jobs where not system)
"""


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="about 100 messages, one fault of each kind (CI)")
    p.add_argument("--messages", type=int, help="inbound messages (default 1000; smoke 100)")
    p.add_argument("--chats", type=int, help="distinct chats (default 97; smoke 23)")
    p.add_argument("--seconds", type=float, help="spread the messages over this long (default 150; smoke 45)")
    p.add_argument("--kill-every", type=float, help="seconds between worker kills (default 8; smoke 20)")
    p.add_argument("--deliveries", type=int, default=3, help="times each webhook is delivered")
    p.add_argument("--drain", type=float, default=240.0, help="seconds to wait for everything to settle")
    p.add_argument("--api", action="store_true", help="drive through the REST API even if webhooks exist")
    p.add_argument("--no-faults", action="store_true", help="the same traffic without any fault (a control run)")
    p.add_argument("--out", help="result file (default bench/CHAOS.md; smoke: a temp file)")
    args = p.parse_args(argv)
    smoke = args.smoke
    args.messages = args.messages or (100 if smoke else 1000)
    args.chats = args.chats or (23 if smoke else 97)
    args.seconds = args.seconds or (45.0 if smoke else 150.0)
    args.kill_every = args.kill_every or (20.0 if smoke else 8.0)
    return args


def _env(db: str, redis_url: str, llm: FakeLLM, telegram: FakeTelegram, root: Path) -> dict[str, str]:
    workspace = root / "workspace"
    workspace.mkdir()
    return make_env(database_url=db, redis_url=redis_url, llm_url=llm.url, workspace=workspace, **{
        **bench_defaults(telegram.url),
        "TOOLS__ALLOWED": json.dumps(["record", "spawn", "cron"]),
        "CHANNELS__DELIVERY__CLAIM_SECONDS": "15",  # a send killed mid-way is retried after this
        "CHANNELS__DELIVERY__REDELIVER_AFTER": "10",  # a delivery task lost with Redis is re-enqueued
        "SUBAGENTS__MAX_CONCURRENT": "10",
    })


def _drain(stack: BenchStack, traffic: Traffic, deadline: float, quiet: float, ctl: Controller) -> bool:
    """Wait for the traffic to end and the system to go quiet (nothing active, queued or pending)."""
    engine = get_engine(stack.settings.database_url)
    calm_since: float | None = None
    while time.monotonic() < deadline:
        try:
            with engine.connect() as conn:
                busy = int(conn.execute(text(QUIESCENT)).scalar_one())
        except Exception:  # Postgres restarting
            busy = 1
        busy += 0 if traffic.done.is_set() else 1
        if busy:
            calm_since = None
        elif calm_since is None:
            calm_since = time.monotonic()
        elif time.monotonic() - calm_since >= quiet:
            return True
        ctl.supervise()
        time.sleep(0.5)
    return False


DUMPS = {
    "runs": "select id, conversation_id, kind, status, phase, step_seq, iteration, parent_run_id, task, origin, "
            "final_text, error, created_at, started_at, finished_at from runs order by created_at",
    "tool_calls": "select id, run_id, step_seq, call_id, name, arguments, status, result, attempts, created_at, "
                  "started_at, finished_at from tool_calls order by created_at",
    "outbox": "select id, key, chat_id, content, status, attempts, run_id, last_error, created_at, delivered_at "
              "from outbox order by created_at",
    "messages": "select id, seq, conversation_id, run_id, role, type, content, tool_call_id, pending, created_at "
                "from messages order by id",
    "cron_receipts": "select * from cron_receipts order by created_at",
}


def _dump(stack: BenchStack, telegram: FakeTelegram) -> None:
    """Everything needed to chase a failure, next to the process logs: tables and what the platform got."""
    with (stack.log_dir / "telegram-sent.jsonl").open("w") as fh:
        for s in telegram.snapshot():
            fh.write(json.dumps({"at": s.at, "chat_id": s.chat_id, "text": s.text}) + "\n")
    with get_engine(stack.settings.database_url).connect() as conn:
        for name, sql in DUMPS.items():
            with (stack.log_dir / f"db-{name}.jsonl").open("w") as fh:
                for row in conn.execute(text(sql)).mappings():
                    fh.write(json.dumps(dict(row), default=str) + "\n")


def _window(stack: BenchStack, telegram: FakeTelegram, ctl: Controller) -> set[str]:
    with get_engine(stack.settings.database_url).connect() as conn:
        rows = Counter((str(c), str(x)) for c, x in conn.execute(text("select chat_id, content from outbox")).all())
    received = [Received(s.at, s.chat_id, s.text) for s in telegram.snapshot()]
    return window_resends(received, rows, ctl.kill_times())


def _replies(stack: BenchStack, telegram: FakeTelegram, via_telegram: bool) -> list[str]:
    if via_telegram:
        return [s.text for s in telegram.snapshot()]
    with get_engine(stack.settings.database_url).connect() as conn:
        return list(conn.execute(text("select content from messages where role = 'ASSISTANT' "
                                      "and tool_calls is null")).scalars())


def run(args: argparse.Namespace, teardown: Teardown) -> tuple[Tally, dict[str, object]]:
    root = Path(tempfile.mkdtemp(prefix="nanofleet-chaos-"))
    root.chmod(0o755)
    pg, redis_server = DedicatedPostgres(root / "pg"), DedicatedRedis(root / "redis")
    teardown.add(pg.stop)
    teardown.add(redis_server.stop)
    db = pg.start()
    upgrade(db)
    llm, telegram = FakeLLM().start(), FakeTelegram().start()
    teardown.add(llm.server.stop)
    teardown.add(telegram.stop)
    llm.handler = handler(max_delay=0.3)
    stack = BenchStack(child_env(_env(db, redis_server.start(), llm, telegram, root)), root / "logs")
    stack.log_dir.mkdir()
    teardown.add(stack.stop)
    ctl = Controller(stack, redis_server, pg, free_port())
    ctl.start()
    via_telegram = stack.has_route("/webhooks/telegram") and not args.api
    traffic = Traffic(args.messages, args.chats, args.deliveries if via_telegram else 1, args.seconds,
                      via_telegram, stack.gateway_url)
    print(f"chaos: {args.messages} messages over {args.seconds:g}s via "
          f"{'Telegram webhooks x' + str(args.deliveries) if via_telegram else 'the REST API'}; logs {stack.log_dir}",
          flush=True)
    traffic.start()
    if args.no_faults:
        ctl.run(seconds=args.seconds, kill_every=1e9, singles=[], stop=lambda: False)
    else:
        ctl.run(seconds=args.seconds, kill_every=args.kill_every, singles=SINGLES, stop=lambda: False)
    settled = _drain(stack, traffic, time.monotonic() + args.drain, quiet=15.0, ctl=ctl)
    ctl.log("drained" if settled else f"NOT drained after {args.drain:g}s")
    _dump(stack, telegram)
    window = _window(stack, telegram, ctl) if via_telegram else set()
    tally = collect(get_engine(db), stack.workspace, args.messages, _replies(stack, telegram, via_telegram), window)
    facts: dict[str, object] = {
        "via": "telegram" if via_telegram else "api", "settled": settled, "events": ctl.events,
        "sent": traffic.sent, "failed_attempts": traffic.failed_attempts, "abandoned": traffic.abandoned,
        "logs": str(stack.log_dir), "elapsed": time.monotonic() - ctl.began,
    }
    return tally, facts


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    Teardown.install_signals()
    teardown = Teardown()
    command = shlex.join([".venv/bin/python", "-m", "bench.chaos", *(sys.argv[1:] if argv is None else argv)])
    try:
        tally, facts = run(args, teardown)
    finally:
        teardown.run()
    table, markdown, ok = render(tally, facts, args, command)
    print(table)
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "nanofleet-CHAOS-smoke.md" if args.smoke
                                           else BENCH_DIR / "CHAOS.md")
    out.write_text(markdown)
    print(f"\nwrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
