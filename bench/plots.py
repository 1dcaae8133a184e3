"""PNG plots for RESULTS.md (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def latency_cdf(path: Path, series: Mapping[str, Sequence[float]], *, title: str, mark_ms: float | None = None) -> None:
    """Cumulative distribution of latencies (ms, log x axis), one line per series."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        ordered = sorted(values)
        if not ordered:
            continue
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot(ordered, ys, label=f"{label} (n={len(ordered)})")
    if mark_ms is not None:
        ax.axvline(mark_ms, color="grey", linestyle="--", linewidth=1, label=f"target {mark_ms:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(path: Path, values: dict[str, float], *, title: str, ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(values), list(values.values()), color=["#888888", "#3b7dd8", "#d8903b", "#5aa65a"][: len(values)])
    for i, v in enumerate(values.values()):
        ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stacked_hops(path: Path, hops: dict[str, tuple[float, float]], *, title: str) -> None:
    """Per-hop p50 and p99 (ms) as horizontal bars."""
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(hops) + 1.5))
    names = list(hops)[::-1]
    ax.barh(names, [hops[n][1] for n in names], color="#d8903b", alpha=0.5, label="p99")
    ax.barh(names, [hops[n][0] for n in names], color="#3b7dd8", label="p50")
    ax.set_xlabel("ms")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def concurrency_curve(path: Path, rows: Sequence[tuple[int, float, float, float]], *, title: str) -> None:
    """rows: (target concurrency, turns/s, mean LLM calls in flight, worker RSS MiB)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r[0] for r in rows]
    ax.plot(xs, [r[1] for r in rows], marker="o", color="#3b7dd8", label="turns/s")
    ax.set_xlabel("turns kept in flight by the client")
    ax.set_ylabel("turns/s", color="#3b7dd8")
    ax2 = ax.twinx()
    ax2.plot(xs, [r[2] for r in rows], marker="s", color="#d8903b", label="LLM calls in flight (mean)")
    ax2.plot(xs, [r[3] for r in rows], marker="^", color="#5aa65a", label="worker RSS (MiB)")
    ax2.set_ylabel("in flight / MiB")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=8, loc="upper left")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lines(path: Path, series: Mapping[str, Sequence[float]], *, title: str, xlabel: str, ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, ys in series.items():
        ax.plot(range(1, len(ys) + 1), list(ys), label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
