"""The runtime context a step needs: settings, database, LLM, tools, events."""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlmodel import Session

from shared.agent.events import EventSink, NullEvents
from shared.db import session_scope
from shared.llm import LLMClient
from shared.settings import Settings
from shared.tools import build_registry
from shared.tools.registry import ToolRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Next:
    """A task to enqueue once the step's transaction has committed."""

    task: str
    args: tuple[Any, ...] = ()
    countdown: float | None = None


# Called when a run ends, by run kind, to hand its result on (subagent announcements, delivery).
FinishHook = Callable[["Runtime", Session, Any], list[Next]]


@dataclass
class Runtime:
    settings: Settings
    llm: LLMClient
    tools: ToolRegistry
    events: EventSink = field(default_factory=NullEvents)
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}")
    finish_hooks: dict[str, FinishHook] = field(default_factory=dict)
    # Enqueues best-effort tasks that must not wait for the step to end (a typing indicator);
    # without a broker (`nanofleet agent`) they are dropped.
    send_now: Callable[[list[Next]], None] = field(default=lambda nexts: None)

    @classmethod
    def build(cls, settings: Settings, *, events: EventSink | None = None) -> Runtime:
        _make_workspace(settings.workspace)
        return cls(
            settings=settings,
            llm=LLMClient(settings.llm),
            tools=build_registry(settings),
            events=events or NullEvents(),
        )

    @contextmanager
    def session(self) -> Iterator[Session]:
        with session_scope(self.settings.database_url) as s:
            yield s

    def owner(self) -> str:
        """A fresh lease owner token for one step execution."""
        return f"{self.worker_id}:{uuid.uuid4().hex[:8]}"


def _make_workspace(folder: Path) -> None:
    """The agent's folder exists from the start: file tools write into it, and the prompt and skills
    read from it. One that cannot be made leaves the tools to say why, with the path."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("cannot create the workspace %s (NANOFLEET_WORKSPACE): %s", folder, err)
