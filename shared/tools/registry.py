"""The tool registry: default-deny permission checks, validation, timeouts, size caps, audit."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any, Protocol

from pydantic import ValidationError

from shared.db import unavailable
from shared.settings import Settings
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.run_watch import run_ended

audit = logging.getLogger("TOOL_AUDIT")
log = logging.getLogger(__name__)
MAX_RETRY_DELAY = 2.0  # seconds between tries of a tool whose database did not answer


class ToolProvider(Protocol):
    """A source of tools (the built-in groups, an MCP server)."""

    def tools(self) -> Iterable[Tool]: ...


def is_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Exact names, or glob patterns such as `mcp_github_*`."""
    return any(name == pattern or fnmatchcase(name, pattern) for pattern in allowed)


def decide(tool: Tool, settings: Settings) -> ToolResult | None:
    """None when the tool may run; otherwise the REJECTED result saying why."""
    if not is_allowed(tool.name, settings.tools.allowed):
        return ToolResult.fail(
            ErrorCode.NOT_ALLOWED,
            f"tool '{tool.name}' is not allowed here (an operator can add it to NANOFLEET_TOOLS__ALLOWED)",
        )
    missing = sorted(p.value for p in tool.permissions if p not in settings.permissions.granted)
    if missing:
        return ToolResult.fail(
            ErrorCode.PERMISSION_DENIED,
            f"tool '{tool.name}' needs permission {', '.join(missing)}, which is not granted",
        )
    return None


def _parse_args(raw: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    parsed = json.loads(raw or "{}")
    if not isinstance(parsed, dict):
        raise ValueError("arguments must be a JSON object")
    return parsed


def _size(obj: Any) -> int:
    text = obj if isinstance(obj, str) else json.dumps(obj, default=str, ensure_ascii=False)
    return len(text.encode(errors="surrogatepass"))  # a page may hold a lone surrogate (cleaned when stored)


def _truncated(text: str, limit: int) -> str:
    """The first `limit` bytes of `text` (whole characters), with a note saying so."""
    keep = text.encode(errors="surrogatepass")[:limit].decode(errors="ignore")
    return keep + f"\n[output truncated at {limit} bytes]"


class ToolRegistry:
    """Every tool this process knows, by name."""

    def __init__(self, settings: Settings, tools: Iterable[Tool]) -> None:
        self.settings = settings
        disabled = set(settings.tools.disabled_groups)
        self._tools = {t.name: t for t in tools if t.group not in disabled}
        self._specs: dict[frozenset[str], str] = {}  # exclusions -> the specs as JSON text

    def add(self, tool: Tool) -> None:
        """Add or replace a tool (an MCP server's, from the background loop: the maps are replaced, not
        changed, so a worker thread reading them meanwhile sees the old or the new one whole)."""
        if tool.group not in self.settings.tools.disabled_groups:
            self._tools, self._specs = {**self._tools, tool.name: tool}, {}

    def remove(self, name: str) -> None:
        if name in self._tools:
            self._tools, self._specs = {k: t for k, t in self._tools.items() if k != name}, {}

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def offered(self) -> list[Tool]:
        """The tools the model is offered (and may run), by name: allowed, with their permissions granted."""
        return [t for _, t in sorted(self._tools.items()) if decide(t, self.settings) is None]

    def specs(self, *, exclude: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Schemas of the tools that may run, for the model. Denied tools are not offered. Built once
        per set of exclusions (a JSON schema costs a fraction of a millisecond per tool, every step);
        each caller gets its own copy."""
        skip = frozenset(exclude)
        if skip not in self._specs:
            self._specs[skip] = json.dumps([t.schema() for t in self.offered() if t.name not in skip])
        return list(json.loads(self._specs[skip]))

    def describe(self) -> list[dict[str, Any]]:
        """What GET /api/v1/tools shows."""
        out = []
        for name, t in sorted(self._tools.items()):
            verdict = decide(t, self.settings)
            out.append(
                {
                    "name": name,
                    "group": t.group,
                    "description": t.description,
                    "schema": t.Args.model_json_schema(),
                    "permissions": sorted(p.value for p in t.permissions),
                    "idempotent": t.idempotent,
                    "allowed": verdict is None,
                    "reason": verdict.message if verdict else None,
                }
            )
        return out

    async def execute(self, name: str, raw_args: dict[str, Any] | str, ctx: ToolContext) -> ToolResult:
        """Check, validate, run with a timeout, cap the output, write the audit record."""
        started = time.perf_counter()
        result = await self._execute(name, raw_args, ctx)
        result.elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        return self.audited(name, raw_args, ctx, result)

    @staticmethod
    def audited(name: str, raw_args: dict[str, Any] | str, ctx: ToolContext, result: ToolResult) -> ToolResult:
        """`result` once its audit record is written: `execute` calls it, as does a run that refuses
        a call before the registry sees it (a subagent's tool, arguments it cannot take)."""
        digest = hashlib.sha256(json.dumps(raw_args, sort_keys=True, default=str).encode()).hexdigest()
        audit.info(
            "tool=%s status=%s code=%s duration_ms=%.1f run=%s args_sha256=%s",
            name, result.status, result.error or "", result.elapsed_ms, ctx.run_id, digest,
            extra={"tool": name, "status": result.status, "run_id": ctx.run_id, "args_sha256": digest,
                   "duration_ms": result.elapsed_ms},
        )
        return result

    async def _execute(self, name: str, raw_args: dict[str, Any] | str, ctx: ToolContext) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(t.name for t in self.offered()) or "none"  # naming a denied one invites a try
            return ToolResult.fail(ErrorCode.NOT_FOUND, f"there is no tool named '{name}'; available: {available}")
        if (verdict := decide(tool, self.settings)) is not None:
            return verdict
        if _size(raw_args) > tool.max_input_bytes:
            return ToolResult.fail(ErrorCode.TOO_LARGE, f"arguments exceed {tool.max_input_bytes} bytes")
        try:
            args = tool.Args.model_validate(_parse_args(raw_args))
        except (ValidationError, ValueError) as err:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"invalid arguments for '{name}': {err}")
        timeout = tool.timeout or self.settings.tools.default_timeout
        try:
            result = await asyncio.wait_for(_until_run_ends(tool, args, ctx), timeout)
        except TimeoutError:
            return ToolResult.fail(ErrorCode.TIMEOUT, f"'{name}' did not finish within {timeout:g} s", retryable=True)
        except Exception as err:  # a tool must never take the run down
            log.exception("tool %s raised", name)
            result = ToolResult.fail(ErrorCode.FAILED, f"'{name}' failed: {type(err).__name__}: {err}")
        return self._cap(tool, result)

    @staticmethod
    def _cap(tool: Tool, result: ToolResult) -> ToolResult:
        """The result within the tool's max_output_bytes: a failure's message too (an MCP server's
        error text can be megabytes, stored with the call and read again by the model every step)."""
        limit = tool.max_output_bytes
        if not result.ok:
            if _size(result.message) > limit:
                result.message = _truncated(result.message, limit)
        elif _size(result.output) > limit:
            if not isinstance(result.output, str):
                return ToolResult.fail(ErrorCode.TOO_LARGE, f"output exceeds {limit} bytes")
            result.output = _truncated(result.output, limit)
        return result


async def _until_run_ends(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
    """The tool's result; or, once its run ended (`/stop`, a cancel, the sweeper giving up), a failure
    at once: the call is cancelled rather than left to fetch or wait for an MCP server until its
    timeout, for nobody. A call outside a run (a test, a script) has nothing to watch."""
    if not ctx.run_id or tool.watches_run:
        return await _run(tool, args, ctx)
    work = asyncio.ensure_future(_run(tool, args, ctx))
    watch = asyncio.ensure_future(run_ended(ctx.settings.database_url, ctx.run_id))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when the call itself is cancelled (its timeout)
        for task in (watch, work):
            task.cancel()
        await asyncio.gather(watch, work, return_exceptions=True)
    if work.cancelled() and not watch.cancelled():  # the watch saw the run end first
        return ToolResult.fail(ErrorCode.FAILED, f"stopped: the run {watch.result()} while this call ran; "
                               "it was cancelled")
    return work.result()


async def _run(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
    """The tool's result. An idempotent one that found nanofleet's database unreachable (cron, spawn,
    message: a restart, a failover) runs again until it answers, within its timeout: told it failed,
    the model may well not try again, and what the user asked for would never happen."""
    delay = 0.1
    while True:
        try:
            return await tool.run(args, ctx)
        except Exception as err:
            if not (tool.idempotent and unavailable(err)):
                raise
            log.warning("tool %s: the database did not answer (%s); trying again", tool.name, type(err).__name__)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_DELAY)
