"""Figures, the printed table, RESULTS.md / CHAOS.md, and the machine they were measured on."""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent


@dataclass
class Figure:
    """One measured number, its target and the command that produced it."""

    item: str
    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None  # None: no target, or not measured
    command: str = ""
    note: str = ""

    def shown(self) -> str:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return "n/a"
        if abs(self.value) >= 100 or float(self.value).is_integer():
            return f"{self.value:,.0f} {self.unit}".strip()
        return f"{self.value:.3g} {self.unit}".strip()

    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "-"}[self.ok]


@dataclass
class Report:
    """Everything one run measured, in the order it was measured."""

    title: str
    command: str
    figures: list[Figure] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (heading, markdown)
    plots: list[tuple[str, str]] = field(default_factory=list)  # (caption, file name in bench/)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (item, why)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def table(self) -> str:
        rows = [("item", "figure", "value", "target", "verdict")]
        rows += [(f.item, f.name, f.shown(), f.target, f.verdict()) for f in self.figures]
        rows += [(item, "(skipped)", why, "", "") for item, why in self.skipped]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def markdown(self) -> str:
        out = [f"# {self.title}", "", machine_markdown(), "", f"Whole run: `{self.command}`", ""]
        out += ["| item | figure | value | target | verdict | command |", "|---|---|---|---|---|---|"]
        for f in self.figures:
            note = f" ({f.note})" if f.note else ""
            out.append(f"| {f.item} | {f.name}{note} | {f.shown()} | {f.target} | {f.verdict()} | `{f.command}` |")
        for item, why in self.skipped:
            out.append(f"| {item} | not measured | {why} | | | |")
        for heading, body in self.sections:
            out += ["", f"## {heading}", "", body.rstrip()]
        if self.plots:
            out += ["", "## Plots", ""]
            out += [f"![{caption}]({name})" for caption, name in self.plots]
        return "\n".join(out) + "\n"

    def write(self, path: Path) -> None:
        path.write_text(self.markdown())


def git_commit() -> str:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD") or "unknown"
    # the run's own outputs (plots, RESULTS.md, CHAOS.md) are not changes to what it measured
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/*.png", ":!bench/*.md")
    return commit + (" (with uncommitted changes)" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_markdown() -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ram = psutil.virtual_memory().total / 2**30
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join([
        f"- date: {now}",
        f"- machine: {os.cpu_count()} CPUs ({cpu_model()}), {ram:.1f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}",
        f"- load average at the end: {load} (the machine is shared; other sessions' tests may run)",
        f"- git commit: {git_commit()}",
    ])


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank), NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f}"
