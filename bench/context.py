"""What every benchmark item gets: the stack, the fakes, the counts, the report and where to write."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.config import Config
from bench.fakes import FakeTelegram
from bench.report import Report
from bench.stack import BenchStack
from tests.fakes.llm import FakeLLM


@dataclass
class Ctx:
    stack: BenchStack
    llm: FakeLLM
    telegram: FakeTelegram
    cfg: Config
    report: Report
    out: Path  # RESULTS.md and the plots go here

    def plot(self, name: str) -> Path:
        return self.out / name
