"""Fixtures for the tool tests: a registry over a temporary workspace, a fake web site on loopback."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from shared.aio import run_sync
from shared.db import get_engine
from shared.models import Conversation, Run, RunKind
from shared.settings import Permission, Settings, load_settings
from shared.tools import build_registry
from shared.tools.base import ToolContext, ToolResult
from shared.tools.registry import ToolRegistry
from tests.fakes.web import FakeWeb

ALL_PERMISSIONS = [p.value for p in Permission]
# Where make_run's runs come from unless said otherwise: a Telegram chat, answering its message 7
MESSAGE_ORIGIN = {"channel": "telegram", "chat_id": "42", "reply_meta": {"reply_to_message_id": 7}}


def tool_settings(workspace: Path, *, allowed: list[str] | None = None, granted: list[str] | None = None,
                  **tools: Any) -> Settings:
    """Settings for in-process tool tests: everything allowed and granted unless said otherwise."""
    return load_settings(
        workspace=workspace,
        tools={"allowed": ["*"] if allowed is None else allowed, **tools},
        permissions={"granted": ALL_PERMISSIONS if granted is None else granted},
    )


def call(registry: ToolRegistry, name: str, args: dict[str, Any] | str, **ctx: Any) -> ToolResult:
    """Run one tool call through the real registry, as the tools queue does."""
    return run_sync(registry.execute(name, args, ToolContext(settings=registry.settings, **ctx)))


@pytest.fixture
def open_workspace() -> Iterator[Path]:
    """A workspace the unprivileged user a root worker runs commands as can use (pytest's own temp
    folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="nanofleet-exec-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def registry(workspace: Path) -> Callable[..., ToolRegistry]:
    """`registry(**settings)`: the built-in tools over the test's workspace."""

    def make(**kw: Any) -> ToolRegistry:
        return build_registry(tool_settings(workspace, **kw))

    return make


@pytest.fixture(scope="session")
def web() -> Iterator[FakeWeb]:
    site = FakeWeb().start()
    yield site
    site.stop()


@pytest.fixture
def make_run(database_url: str) -> Callable[..., Run]:
    def make(kind: RunKind = RunKind.TURN, origin: dict[str, Any] | None = None) -> Run:
        with Session(get_engine(database_url), expire_on_commit=False) as s:
            conv = Conversation(session_key=f"telegram:{len(s.exec(select(Conversation)).all())}")
            s.add(conv)
            s.flush()
            run = Run(conversation_id=conv.id, kind=kind, origin=origin or MESSAGE_ORIGIN)
            s.add(run)
            s.commit()
            return run

    return make


def deep_folder(root: Path, depth: int = 30) -> str:
    """A folder `depth` levels of 200-character names down (6,000 characters: past PATH_MAX), made by
    descriptor; its path relative to `root`."""
    names, fd = [], os.open(root, os.O_RDONLY)
    try:
        for i in range(depth):
            names.append(f"{i:02}" + "d" * 198)
            os.mkdir(names[-1], dir_fd=fd)
            inner = os.open(names[-1], os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    return "/".join(names)
