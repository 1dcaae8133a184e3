"""One persistent session per MCP server and worker process, supervised on the background loop:
connect, list tools, check health periodically (and at once when the server says its tools
changed), reconnect with backoff, mark down on failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from enum import StrEnum
from http import HTTPStatus
from typing import Any

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from shared.tool_settings import MCPServer
from shared.tools.base import ErrorCode, ToolResult

log = logging.getLogger(__name__)
BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
CONNECT_WAIT_MAX = 300.0  # the longest wait for a slow server's start, doubled from the connect timeout
LIST_PAGES = 20
PROBE_STOP = 5.0  # seconds `probe` waits for a session to close


class State(StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"


class Unhealthy(Exception):
    """The session stopped answering; the supervisor reconnects."""


async def list_tools(client: Client, *, refresh: bool = False) -> list[mcp_types.Tool]:
    """Every tool the server lists, across pages."""
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(LIST_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def result_text(result: mcp_types.CallToolResult) -> str:
    """The content blocks of a tool result as text (binary blocks are only described)."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            parts.append(res.text if isinstance(res, mcp_types.TextResourceContents) else f"[resource {res.uri}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{block.type} content ({getattr(block, 'mime_type', '?')}) not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, default=str))
    return "\n".join(parts)


class MCPConnection:
    """A server's session, state and tools; `call` is used by the tools, from the background loop."""

    def __init__(self, name: str, config: MCPServer, *, connect_timeout: float, health_interval: float) -> None:
        self.name, self.config = name, config
        self.connect_timeout, self.health_interval = connect_timeout, health_interval
        self.state = State.CONNECTING
        self.error = ""
        self._error_external = False  # `error` quotes an exception, which may carry the server's own text
        self._http_status: int | None = None  # of the last POST to an HTTP server, when it failed
        self._quiet = False  # a probe's outcome is reported by its caller, not logged
        self.tools: dict[str, mcp_types.Tool] = {}
        self.first_attempt = threading.Event()  # set once the first connection attempt has ended
        self._client: Client | None = None
        self._wake: asyncio.Event | None = None
        self._listeners: list[Callable[[MCPConnection], None]] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._session: asyncio.Task[None] | None = None  # the task that owns the current session
        self._scope: anyio.CancelScope | None = None  # the session task's scope, to cancel it
        self._stopping = False

    # ----------------------------------------------------------------- lifecycle (background loop)

    def on_tools(self, listener: Callable[[MCPConnection], None]) -> None:
        """Call `listener` now and whenever the tool list changes."""
        self._listeners.append(listener)
        if self.tools:
            listener(self)

    async def start(self) -> None:
        if self._supervisor is None:
            self._wake = asyncio.Event()
            self._supervisor = asyncio.create_task(self._supervise(), name=f"mcp-{self.name}")

    async def stop(self) -> None:
        """End the session (its server process is stopped) and the supervision."""
        if self._supervisor is not None:
            self._supervisor.cancel()  # it only ever waits in plain asyncio calls
        self._stopping = True
        if self._client is not None:
            self.kick()  # a live session closes itself cleanly (its server exits at once)
        else:
            self._end_session()
        tasks = {t for t in (self._supervisor, self._session) if t is not None}
        if tasks:
            await asyncio.wait(tasks)
        self._supervisor = self._session = None

    def _end_session(self) -> None:
        """Cancel the session task through its anyio scope: the SDK's task groups expect that, and a
        plain Task.cancel() can leave them waiting forever. A task not yet started has no scope."""
        if self._scope is not None:
            self._scope.cancel()
        elif self._session is not None:
            self._session.cancel()

    def kick(self) -> None:
        """Check health, listing the tools again, now: a call saw the connection fail, or the server
        said its tools changed."""
        if self._wake is not None:
            self._wake.set()

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[Client]:
        cfg = self.config
        if cfg.command:
            params = StdioServerParameters(command=cfg.command, args=cfg.args, env=cfg.plain_env(), cwd=cfg.cwd)
            async with Client(params, message_handler=self._on_message) as client:
                yield client
        elif cfg.url:
            async with create_mcp_http_client(headers=cfg.plain_headers()) as http:
                http.event_hooks["response"].append(self._note_http)
                transport = streamable_http_client(cfg.url.get_secret_value(), http_client=http)
                async with Client(transport, message_handler=self._on_message) as client:
                    yield client
        else:
            raise ValueError(f"NANOFLEET_TOOLS__MCP_SERVERS__{self.name.upper()}: set command (stdio) or url (HTTP)")

    async def _note_http(self, response: httpx2.Response) -> None:
        """Keep the status of a failed POST: the SDK's error says only "Server returned an error response"."""
        if response.request.method == "POST":
            self._http_status = response.status_code if response.status_code >= 400 else None

    def _http_note(self) -> str:
        """' (the server answered HTTP 401 Unauthorized; ...)' after a refused POST, else ''."""
        if (code := self._http_status) is None:
            return ""
        try:
            phrase = f" {HTTPStatus(code).phrase}"
        except ValueError:
            phrase = ""
        hint = f"; check the headers of NANOFLEET_TOOLS__MCP_SERVERS__{self.name.upper()}" if code in (401, 403) else ""
        return f" (the server answered HTTP {code}{phrase}{hint})"

    async def _on_message(self, message: IncomingMessage) -> None:
        """A server that says its tools changed is listed again at once, not at the next health check."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.kick()

    async def _follow(self, client: Client) -> None:
        """Ask a server on the 2026-07-28 protocol for its tool-list changes (on earlier versions it
        sends them unasked, to _on_message), for as long as the session lasts: a stream that ends (an
        HTTP one idle past the client's 5-minute read timeout) is opened again. Each time, the tools
        are listed once it is open: a change before it is not replayed. A server that refuses is
        listed at each health check only."""
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return
        loop, delay = asyncio.get_running_loop(), BACKOFF_START
        while True:
            opened = loop.time()
            try:
                async with client.listen(tools_list_changed=True) as changes:
                    if not changes.honored.tools_list_changed:
                        return
                    self.kick()
                    async for _ in changes:
                        self.kick()
            except SubscriptionLost:
                pass
            except Exception as err:  # refused; the session's health is _watch's to judge
                log.debug("MCP server %s: no tool-list changes (%s)", self.name, _describe(err))
                return
            delay = BACKOFF_START if loop.time() - opened > BACKOFF_MAX else min(delay * 2, BACKOFF_MAX)
            await asyncio.sleep(delay)

    async def _attempt(self, ready: asyncio.Future[None]) -> None:
        """Own one session from connect to loss: list the tools, report ready, watch its health
        (and follow its tool-list changes meanwhile)."""
        self._http_status = None
        with anyio.CancelScope() as self._scope:
            try:
                async with self._open() as client:
                    self._set_tools(await list_tools(client))
                    self._client = client
                    ready.set_result(None)
                    async with anyio.create_task_group() as follow:
                        follow.start_soon(self._follow, client)
                        await self._watch(client)
                        follow.cancel_scope.cancel()
            finally:
                self._client = None
                self._scope = None

    async def _watch(self, client: Client) -> None:
        """Raise Unhealthy when a periodic listing fails (a failed call kicks one at once); return on stop."""
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.health_interval)
            self._wake.clear()
            if self._stopping:
                return
            self._http_status = None  # a refusal noted now is this check's (or a call's meanwhile)
            try:
                tools = await asyncio.wait_for(list_tools(client, refresh=True), self.config.timeout)
            except Exception as err:
                raise Unhealthy(f"health check failed: {type(err).__name__}: {err}") from err
            self._set_tools(tools)

    async def _connect(self, wait: float, *, again: bool = True) -> asyncio.Task[None] | bool:
        """Start a session, waiting `wait` seconds for its tool list; the task that owns it once it is
        up, else DOWN and whether it was too slow (rather than failed). `again`: the supervisor will
        try again (with a longer wait, if this one was too short)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._scope = None
        attempt = self._session = asyncio.create_task(self._attempt(ready))
        done, _ = await asyncio.wait({ready, attempt}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if ready in done:
            self._mark(State.UP, "")
            return attempt
        ready.cancel()
        if attempt not in done:
            self._end_session()
            await asyncio.wait({attempt})  # its server process is being stopped
            self._mark(State.DOWN, f"no answer within {wait:g} s" + (
                "; waiting longer next time" if again and wait < CONNECT_WAIT_MAX else ""))
            return True
        self._mark_lost(attempt)
        return False

    async def probe(self) -> None:
        """Connect once, within the connect timeout, and close again: `state`, `error` and `tools`
        then say what a worker would find now (`nanofleet status`, which keeps no sessions)."""
        self._quiet, self._wake = True, asyncio.Event()
        await self._connect(self.connect_timeout, again=False)
        with contextlib.suppress(TimeoutError):  # an HTTP server may hold the session's DELETE for minutes
            await asyncio.wait_for(self.stop(), PROBE_STOP)

    async def _supervise(self) -> None:
        """Connect, and again after each loss, with backoff. A server too slow to start within the
        connect timeout (a first `npx` download, a cold container) is given twice as long at each
        next attempt, up to CONNECT_WAIT_MAX: with the same wait it would be killed every time."""
        backoff, wait = BACKOFF_START, self.connect_timeout
        while True:
            session = await self._connect(wait)
            self.first_attempt.set()
            if isinstance(session, asyncio.Task):
                backoff, wait = BACKOFF_START, self.connect_timeout
                await asyncio.wait({session})  # unlike `await session`, never passes a cancellation on
                self._mark_lost(session)
            elif session:  # too slow
                wait = min(wait * 2, max(CONNECT_WAIT_MAX, self.connect_timeout))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _mark(self, state: State, error: str, *, external: bool = False) -> None:
        if not self._quiet and (state != self.state or error != self.error):
            (log.info if state == State.UP else log.warning)(
                "MCP server %s is %s%s", self.name, state.value, f": {error}" if error else "")
        self.state, self.error, self._error_external = state, error, external

    def _mark_lost(self, session: asyncio.Task[None]) -> None:
        """DOWN, saying why the session ended (with the HTTP status of a refused request, if one was)."""
        self._mark(State.DOWN, _outcome(session) + self._http_note(), external=not session.cancelled())

    def _set_tools(self, tools: list[mcp_types.Tool]) -> None:
        """Keep the listing; tell the listeners when a tool came, went, or changed its description or schema."""
        listed = {t.name: t for t in tools}
        changed, self.tools = listed != self.tools, listed
        if changed:
            for listener in self._listeners:
                try:
                    listener(self)
                except Exception:  # the connection is fine: a failing listener must not mark it down
                    log.exception("MCP server %s: taking its tool list failed", self.name)

    # ----------------------------------------------------------------- calls (background loop)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a tool; a down server, a lost connection or a timeout give a retryable failure."""
        client = self._client
        if self.state != State.UP or client is None:
            why = f" ({self.error})" if self.error else ""
            return ToolResult.fail(ErrorCode.FAILED, f"MCP server '{self.name}' is not connected{why}; it "
                                   "reconnects by itself, try again shortly", retryable=True,
                                   untrusted=bool(why) and self._error_external)
        timeout = self.config.timeout
        try:
            result = await asyncio.wait_for(client.call_tool(tool, arguments, read_timeout_seconds=timeout),
                                            timeout + 2)  # a backstop: the SDK's own timeout fires first
        except TimeoutError:
            return _timed_out(self.name, tool, timeout)
        except MCPError as err:
            if err.code == mcp_types.REQUEST_TIMEOUT:
                return _timed_out(self.name, tool, timeout)
            if err.code == mcp_types.CONNECTION_CLOSED:
                self.kick()
                return ToolResult.fail(ErrorCode.FAILED, f"MCP server '{self.name}' closed the connection "
                                       "during the call; it reconnects by itself", retryable=True)
            return ToolResult.fail(ErrorCode.FAILED, f"MCP error from '{self.name}': {err}", untrusted=True)
        except Exception as err:  # its text may quote what the server sent
            self.kick()
            return ToolResult.fail(ErrorCode.FAILED, f"MCP call failed: {_describe(err)}", retryable=True,
                                   untrusted=True)
        text = result_text(result)
        if result.is_error:
            return ToolResult.fail(ErrorCode.FAILED, text or f"'{tool}' reported an error", untrusted=bool(text))
        return ToolResult.success(text, untrusted=True)


def _timed_out(server: str, tool: str, timeout: float) -> ToolResult:
    return ToolResult.fail(ErrorCode.TIMEOUT, f"MCP tool '{tool}' on '{server}' did not answer within {timeout:g} s",
                           retryable=True)


def _outcome(task: asyncio.Task[None]) -> str:
    return "session ended" if task.cancelled() else _describe(task.exception())


def _describe(err: BaseException | None) -> str:
    if err is None:
        return "session ended"
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}"
