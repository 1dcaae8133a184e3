"""The tools' settings: which may run, each group's limits, MCP servers, and the workspace files the
file tools may not change."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class ExecSettings(BaseModel):
    """The shell tool's limits."""

    default_timeout: int = 60
    max_timeout: int = 600
    max_output_chars: int = 10_000
    run_as_user: str = "nobody"
    path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # PATH of commands
    env: dict[str, SecretStr] = Field(default_factory=dict)  # extra variables for commands (e.g. GH_TOKEN)


class WebSettings(BaseModel):
    """Outbound HTTP from tools: timeouts, size caps, search backend, SSRF allowlist."""

    http_timeout: float = 3.0
    fetch_timeout: float = 10.0
    max_response_bytes: int = 2_000_000
    search_backend: Literal["duckduckgo", "brave"] = "duckduckgo"
    brave_api_key: SecretStr | None = None
    brave_api_base: str = "https://api.search.brave.com/res/v1"
    allow_hosts: list[str] = Field(default_factory=list)  # host or host:port that skip the SSRF guard


class MessageSettings(BaseModel):
    """Where the message tool may send besides the chat it is used in."""

    # "channel:chat_id", or "channel:*" for every chat there. Empty: the current chat only, so text
    # the model read (a fetched page, a file) cannot have it write to other people.
    send_to: list[str] = Field(default_factory=list, examples=[["slack:C0123456", "telegram:*"]])
    # The largest workspace file it sends (also bounded by each platform's own limit); files are kept in
    # Postgres until delivered, and for the retention after.
    max_file_bytes: int = Field(default=20_000_000, ge=1, le=1_000_000_000)

    def allows(self, channel: str, chat_id: str) -> bool:
        return f"{channel}:{chat_id}" in self.send_to or f"{channel}:*" in self.send_to


class MCPServer(BaseModel):
    """An MCP server: stdio (command) or streamable HTTP (url)."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict)  # tokens, mostly: kept out of logs and reprs
    cwd: str | None = None
    url: SecretStr | None = None  # may carry a token in its query
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout: float = 30.0

    def plain_env(self) -> dict[str, str] | None:
        return {k: v.get_secret_value() for k, v in self.env.items()} or None

    def plain_headers(self) -> dict[str, str] | None:
        return {k: v.get_secret_value() for k, v in self.headers.items()} or None

    def fingerprint(self) -> str:
        """The whole configuration, secrets included, as a digest: equal for equal configurations."""
        plain = {**self.model_dump(mode="json"), "env": self.plain_env(), "headers": self.plain_headers(),
                 "url": self.url.get_secret_value() if self.url else None}
        return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


# Variables for commands and MCP servers set one by one, whose names the environment's settings read
# lowercased (NANOFLEET_TOOLS__EXEC__ENV__GH_TOKEN gave commands gh_token): (setting path, variable name)
ONE_BY_ONE = re.compile(r"NANOFLEET_TOOLS__(?:EXEC|MCP_SERVERS__(?P<server>.+?))__ENV__(?P<name>.+)", re.IGNORECASE)


def env_names_as_given(data: Any, environ: Mapping[str, str]) -> None:
    """Give the variables in `data` (the settings as read, before validation) that were set one by one
    the case of their names in `environ`: a server or command looks up GITHUB_TOKEN, not github_token.
    The environment's value wins over a config file's of the same name, as for every setting."""
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, dict):
        return
    for key in environ:
        if not (found := ONE_BY_ONE.fullmatch(key)):
            continue
        servers = tools.get("mcp_servers")
        owner = tools.get("exec") if found["server"] is None else \
            servers.get(found["server"].lower()) if isinstance(servers, dict) else None
        env = owner.get("env") if isinstance(owner, dict) else None
        name = found["name"]
        if isinstance(env, dict) and name != name.lower() and name.lower() in env:
            env[name] = env.pop(name.lower())


# What names a secret: a word of its name (GITHUB_PAT, DB_PWD), or a part of one (APIKEY, ACCESSTOKEN)
SECRET_WORDS = frozenset({"pw", "pwd", "pass", "pin", "otp", "pat", "salt", "hmac", "seed", "dsn", "auth", "cred",
                          "creds", "cookie", "session", "sid", "sig", "jwt", "private", "bearer", "license", "proxy"})
SECRET_PARTS = ("token", "key", "secret", "passw", "credential", "signature", "signing", "authoriz")

def looks_secret(name: str, value: str) -> bool:
    """Whether a variable or header given to commands or MCP servers may hold a secret, and is masked in
    logs: by its name, or a word of its value that looks like a token (long, of letters and digits or
    of both cases), or a URL with a login. Plain words, numbers, hosts and paths are not (LOG_LEVEL=error
    masked every "error" in the logs)."""
    lowered = name.lower()
    if any(part in lowered for part in SECRET_PARTS) or SECRET_WORDS & set(re.split(r"[^a-z0-9]+", lowered)):
        return True
    return ("://" in value and "@" in value) or any(_token_like(word) for word in value.split())


def _token_like(word: str) -> bool:
    if len(word) < 8 or "/" in word:
        return False
    digits, letters = any(c.isdigit() for c in word), any(c.isalpha() for c in word)
    return (digits and letters) or (any(c.isupper() for c in word) and any(c.islower() for c in word))


PROTECTED_FILES = ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "HEARTBEAT.md", "skills")


def workspace_path(entry: str) -> str:
    """`entry` as a normalised path relative to the workspace (no `./`, no trailing `/`)."""
    parts = [p for p in entry.strip().split("/") if p not in ("", ".")]
    if entry.strip().startswith(("/", "~")) or ".." in parts or not parts:
        raise ValueError(f"{entry!r} must be a path inside the workspace, relative to it (such as 'AGENTS.md')")
    return "/".join(parts)


class ToolsSettings(BaseModel):
    """Which tools may run (default deny) and their groups' settings."""

    allowed: list[str] = Field(default_factory=list, examples=[["time", "read_file"]])
    plugins: list[str] = Field(default_factory=list, examples=[["mytools.weather:WeatherTool"]])  # your own tools
    disabled_groups: list[str] = Field(default_factory=list)
    default_timeout: float = 60.0
    exec: ExecSettings = Field(default_factory=ExecSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    message: MessageSettings = Field(default_factory=MessageSettings)
    mcp_servers: dict[str, MCPServer] = Field(default_factory=dict)
    mcp_connect_timeout: float = 10.0  # start-up waits at most this long for the servers' tool lists
    mcp_health_interval: float = 30.0  # seconds between checks of each MCP session
    # Workspace paths (a folder: all below it) the file tools may read but never change: these shape
    # every conversation's system prompt and the periodic runs, so text the model read elsewhere (a
    # fetched page) must not end up in them. MEMORY.md, the agent's own memory, stays writable.
    protected_files: list[str] = Field(default_factory=lambda: list(PROTECTED_FILES))

    @field_validator("protected_files")
    @classmethod
    def _check_protected(cls, v: list[str]) -> list[str]:
        return [workspace_path(entry) for entry in v]
