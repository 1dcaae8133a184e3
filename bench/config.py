"""How much each benchmark item measures (full and --quick), and the command that reproduces it."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, fields

ITEMS = ("webhook", "overhead", "inflight", "scaleout", "recovery", "tokens", "memory")


@dataclass
class Config:
    """Counts and durations; every field is a --flag of `python -m bench.run`."""

    webhook_seconds: float = 10.0  # per closed-loop phase (bare and telegram alternate, 2 rounds)
    # closed-loop clients, each level in turn; an endpoint's max throughput is its best level's rate
    webhook_concurrency: str = "16,64"
    webhook_rate: float = 200.0  # open-loop requests/s for the latency figure
    webhook_rate_seconds: float = 15.0
    overhead_turns: int = 500
    inflight_levels: str = "25,50,100,200,400,700,1000"
    inflight_window: float = 8.0
    inflight_threads: int = 1100
    llm_delay: float = 2.0
    scale_concurrency: int = 64
    scale_window: float = 15.0
    kills: int = 10
    token_turns: int = 100  # a user message and a reply each: 200 messages
    quick: bool = False
    only: str = ""
    shared_postgres: str = ""  # postgresql+psycopg://... : a fresh nanofleet_bench_<id> database there instead
    shared_redis: str = ""  # redis://host:port : a claimed database number there instead of a private server

    @classmethod
    def quick_preset(cls) -> dict[str, object]:
        return {"webhook_seconds": 3.0, "webhook_rate_seconds": 5.0, "overhead_turns": 100,
                "inflight_levels": "25,100,300", "inflight_window": 5.0, "inflight_threads": 400,
                "scale_window": 6.0, "kills": 3, "token_turns": 40}

    @classmethod
    def parse(cls, argv: list[str] | None = None) -> Config:
        parser = argparse.ArgumentParser(prog="python -m bench.run", description="nanofleet benchmarks")
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.type == "bool":
                parser.add_argument(flag, action="store_true", help="about 2 minutes instead of ~12"
                                    if f.name == "quick" else None)
            else:
                kind = {"float": float, "int": int}.get(str(f.type), str)
                parser.add_argument(flag, type=kind, default=None)
        args = vars(parser.parse_args(argv))
        values: dict[str, object] = cls.quick_preset() if args.get("quick") else {}
        values.update({k: v for k, v in args.items() if v not in (None, False)})
        if args.get("quick"):
            values["quick"] = True
        cfg = cls(**values)  # type: ignore[arg-type]
        unknown = set(cfg.items()) - set(ITEMS)
        if unknown:
            parser.error(f"--only: unknown item(s) {', '.join(sorted(unknown))}; known: {', '.join(ITEMS)}")
        return cfg

    def items(self) -> list[str]:
        return [i.strip() for i in self.only.split(",") if i.strip()] or list(ITEMS)

    def levels(self) -> list[int]:
        return _ints(self.inflight_levels)

    def webhook_clients(self) -> list[int]:
        return _ints(self.webhook_concurrency)

    def command(self, item: str | None = None) -> str:
        """The command that reproduces `item` (or the whole run) with these counts."""
        parts = [".venv/bin/python", "-m", "bench.run"]
        if self.quick:
            parts.append("--quick")
        defaults = Config(**self.quick_preset()) if self.quick else Config()  # type: ignore[arg-type]
        for f in fields(self):
            if f.name in ("quick", "only"):
                continue
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name):
                parts += ["--" + f.name.replace("_", "-"), str(value)]
        if item:
            parts += ["--only", item]
        elif self.only:
            parts += ["--only", self.only]
        return shlex.join(parts)


def _ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x.strip()]
