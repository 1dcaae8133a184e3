"""`make bench`: start the system on loopback, measure every item side by side, print a table and
write RESULTS.md plus PNG plots (bench/ for a full run; a temp dir for --quick or --only runs)."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import inflight, memory, overhead, recovery, tokens, webhook
from bench.config import Config
from bench.context import Ctx
from bench.fakes import FakeTelegram
from bench.report import BENCH_DIR, Report
from bench.stack import Teardown, bench_stack
from tests.fakes.llm import FakeLLM

RUNNERS: dict[str, Callable[[Ctx], None]] = {
    "webhook": webhook.run,
    "overhead": overhead.run,
    "inflight": inflight.run_inflight,
    "scaleout": inflight.run_scaleout,
    "recovery": recovery.run,
    "tokens": tokens.run,
    "memory": memory.run,
}


def _out_dir(cfg: Config, override: str | None) -> Path:
    if override:
        return Path(override)
    if cfg.quick or cfg.only:
        return Path(tempfile.mkdtemp(prefix="nanofleet-bench-out-"))
    return BENCH_DIR


def main(argv: list[str] | None = None) -> int:
    cfg = Config.parse(argv)
    out = _out_dir(cfg, None)
    Teardown.install_signals()
    teardown = Teardown()
    report = Report("nanofleet benchmarks", cfg.command())
    began = time.monotonic()
    try:
        llm = FakeLLM().start()
        teardown.add(llm.server.stop)
        telegram = FakeTelegram().start()
        teardown.add(telegram.stop)
        with bench_stack(teardown=teardown, shared_postgres=cfg.shared_postgres or None,
                         shared_redis=cfg.shared_redis or None, llm=llm, name="bench",
                         telegram_url=telegram.url) as stack:
            stack.gateway()
            ctx = Ctx(stack, llm, telegram, cfg, report, out)
            for item in cfg.items():
                print(f"== {item} ({time.monotonic() - began:.0f}s)", flush=True)
                RUNNERS[item](ctx)
                llm.reset()
                telegram.reset()
            print(f"logs: {stack.log_dir}")
    finally:
        teardown.run()
    report.sections.append(("Run", f"Took {time.monotonic() - began:.0f} s in all."))
    print(report.table())
    report.write(out / "RESULTS.md")
    print(f"\nwrote {out / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
