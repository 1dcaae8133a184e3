"""One Settings object: environment (NANOFLEET_*, nested with __) over an optional TOML file."""

from __future__ import annotations

import os
import tomllib
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as SourceError

from shared.channel_settings import PLACEHOLDERS, ChannelsSettings, not_placeholder
from shared.redis_urls import redis_url_problem
from shared.settings_errors import SettingsError as SettingsError  # raised here; callers import it from here
from shared.settings_errors import describe_unparsable, describe_validation
from shared.tool_settings import ToolsSettings, env_names_as_given, looks_secret

CONFIG_FILE_ENV = "NANOFLEET_CONFIG_FILE"
POSTGRES_SCHEMES = ("postgresql+psycopg", "postgresql", "postgres")  # hosted Postgres URLs often say postgres://
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # NANOFLEET_LOG_LEVEL, in any case
# Passwords anyone can read in an example: nanofleet's compose file and .env.example shipped "nanofleet"
# (a word in every log line, where redaction masked it: "Task ***.agent.step[...] received") and, for
# Flower, "change-me-now" (docker/entrypoint.sh refuses these for Flower: keep its list the same).
SHIPPED_PASSWORDS = frozenset({"nanofleet", "change-me-now", *PLACEHOLDERS})


def shipped_password(url: str, *, compose_variable: str) -> None:
    """Refuse a URL whose password is an example's, as placeholder secrets are refused."""
    password = urlsplit(url).password
    if password is not None and unquote(password).strip().lower() in SHIPPED_PASSWORDS:
        raise ValueError(f"its password is an example anyone can read ({unquote(password)!r}); set one of your own "
                         f"(under docker compose: {compose_variable} in .env), and change it on the server first "
                         "if the server uses it: docs/operations.md, 'Rotating secrets'")


class Permission(StrEnum):
    """Capabilities a tool may require; granted by the operator, denied by default."""

    NET_HTTP = "NET_HTTP"
    FS_READ = "FS_READ"
    FS_WRITE = "FS_WRITE"
    SHELL = "SHELL"


class LLMProfile(BaseModel):
    """One model and where to reach it."""

    model: str = "openai/gpt-4.1-mini"
    api_base: str | None = None
    api_key: SecretStr | None = None
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    # Prompt tokens the model takes. Unset: what litellm's model map says, at most 128,000 (and
    # 128,000 for a model it does not know).
    context_window: int | None = Field(default=None, ge=1)
    # USD per token, for a model litellm's price map does not know (self-hosted, or newer than the
    # map; such a model's usage is otherwise recorded at no cost), or to override it. Both or neither.
    input_cost_per_token: float | None = Field(default=None, ge=0)
    output_cost_per_token: float | None = Field(default=None, ge=0)
    # Whether the model takes images: photos sent in a chat are shown to it. Unset: as litellm's
    # model map says (a model the map does not know is taken to see none).
    vision: bool | None = None

    @field_validator("api_key")
    @classmethod
    def _check_key(cls, v: SecretStr | None) -> SecretStr | None:
        return not_placeholder(v)

    @model_validator(mode="after")
    def _consistent(self) -> LLMProfile:
        if (self.input_cost_per_token is None) != (self.output_cost_per_token is None):
            raise ValueError("set input_cost_per_token and output_cost_per_token together, or neither")
        if self.max_tokens and self.context_window and self.max_tokens > self.context_window * 3 // 4:
            raise ValueError(f"max_tokens ({self.max_tokens}) leaves less than a quarter of context_window "
                             f"({self.context_window}) for the prompt: make it smaller")
        return self


class LLMSettings(LLMProfile):
    """The default model, named profiles, and how calls are retried."""

    profiles: dict[str, LLMProfile] = Field(default_factory=dict)
    # Tried in order when a call to the model fails for good (its retries spent, or refused): profile
    # names, or litellm model strings (on the default endpoint when of the default model's provider).
    fallbacks: list[str] = Field(default_factory=list)
    # The model that turns voice messages into text (a profile name, or a litellm model string, on the
    # default endpoint when of the default model's provider: openai/whisper-1); empty: a notice instead.
    transcription_model: str = ""
    timeout: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_base_delay: float = Field(default=1.0, ge=0)
    retry_max_delay: float = Field(default=30.0, ge=0)
    # Concurrent HTTP connections to the model endpoints per process: an LLM call waiting on the
    # network holds one, so this caps the calls a worker keeps in flight (httpx's default is 100).
    max_connections: int = Field(default=1000, ge=1)
    # Models an API request may name (its "model") besides the default and the profiles; empty: any
    # litellm model string, called on the default endpoint with the default key.
    allowed_models: list[str] = Field(default_factory=list)

    @field_validator("profiles")
    @classmethod
    def _profiles_name_models(cls, v: dict[str, LLMProfile]) -> dict[str, LLMProfile]:
        for name, profile in v.items():  # (a misspelt "model" key left the built-in default)
            if "model" not in profile.model_fields_set:
                raise ValueError(f"profile {name!r} names no model: give it one (a litellm model string)")
        return v

    @model_validator(mode="after")
    def _known_models(self) -> LLMSettings:
        named = [("fallback", name) for name in self.fallbacks]
        if self.transcription_model:
            named.append(("transcription_model", self.transcription_model))
        for what, name in named:
            if name not in self.profiles and "/" not in name:
                raise ValueError(f"{what} {name!r} is neither a profile (NANOFLEET_LLM__PROFILES) nor a litellm "
                                 "model string (provider/model)")
        return self

    def longest(self) -> float:
        """Seconds a model call may take at most: for each model it may try, every try at the timeout
        and every pause at its cap."""
        per_model = (self.max_retries + 1) * self.timeout + self.max_retries * self.retry_max_delay
        return (1 + len(self.fallbacks)) * per_model

    def refuses(self, model: str) -> str | None:
        """Why an API request may not ask for `model` (None when it may). A string with a URL in it
        is refused unless listed: some litellm providers (oobabooga/http://...) call the URL it
        names, which would send the whole prompt to any host, past the SSRF guard."""
        if model == self.model or model in self.profiles or model in self.allowed_models:
            return None
        if not self.allowed_models and "://" not in model:
            return None
        choices = ", ".join(sorted({self.model, *self.profiles, *self.allowed_models}))
        why = "names a URL, and only a listed one may" if "://" in model else "is not allowed here"
        return f"model {model!r} {why}; ask for one of: {choices} (NANOFLEET_LLM__ALLOWED_MODELS lists more)"


class PermissionsSettings(BaseModel):
    """Permissions granted to tools; none by default."""

    granted: list[Permission] = Field(default_factory=list, examples=[["NET_HTTP", "FS_READ"]])


class MemorySettings(BaseModel):
    """How much history goes into a prompt and when it is compacted."""

    window: int = Field(default=20, ge=1)
    compact_after: int = Field(default=40, ge=1)
    context_strategy: Literal["hard_trim", "sliding_window", "summarize"] = "sliding_window"


class AgentSettings(BaseModel):
    """The agent loop."""

    name: str = "nanofleet"
    max_iterations: int = Field(default=20, ge=1)
    mailbox_mode: Literal["steer", "followup"] = "steer"
    chat_timeout: float = Field(default=120.0, gt=0)


class SubagentSettings(BaseModel):
    """Background subagents."""

    max_iterations: int = Field(default=15, ge=1)
    max_concurrent: int = Field(default=3, ge=1)


class RuntimeSettings(BaseModel):
    """Run leases and the recovery sweeper."""

    lease_seconds: float = Field(default=4.0, gt=0)
    sweep_interval: float = Field(default=1.0, gt=0)
    requeue_grace: float = Field(default=15.0, ge=0)  # after the sweeper re-enqueues a step: before it may again
    # A step (or idempotent tool call) that failed this many times (it raised, or its worker died in
    # it) fails its run instead of being tried again: something in it kills workers or always raises.
    # An inbound message whose submission raised this many times is set aside (shared.channels.inbound).
    max_recoveries: int = Field(default=5, ge=1)


class DailySummarySettings(BaseModel):
    enabled: bool = False
    cron: str = "0 9 * * *"


class SchedulerSettings(BaseModel):
    """Scheduled jobs owned by the system."""

    daily_summary: DailySummarySettings = Field(default_factory=DailySummarySettings)
    timezone: str = "UTC"
    reconcile_interval: float = Field(default=30.0, gt=0)  # seconds between checks that redbeat mirrors the cron jobs
    beat_lock_timeout: int = Field(default=15, ge=1)  # seconds before a standby beat takes over from one that died
    # Jobs the model adds (the `cron` tool; each firing is a paid LLM run): how often one may fire at
    # most, and how many jobs a chat may hold for it to add another. The REST API and CLI are not bound.
    tool_min_interval: int = Field(default=60, ge=1)
    tool_max_jobs: int = Field(default=20, ge=0)


class RetentionSettings(BaseModel):
    """How long operational records are kept (see shared/housekeeping.py); chats' messages are kept."""

    days: int = Field(default=30, ge=0)  # 0 keeps everything
    interval: float = Field(default=3600.0, gt=0)  # seconds between retention passes


class HeartbeatSettings(BaseModel):
    """Periodic look at HEARTBEAT.md in the workspace."""

    enabled: bool = True
    interval: int = Field(default=1800, ge=1)
    model: str | None = None


class DatabaseSettings(BaseModel):
    """The connection pool of each process (the server is NANOFLEET_DATABASE_URL's; shared/db.py)."""

    # Kept open per process. A burst above pool_size opens up to max_overflow more, closed again on
    # return (a Postgres backend start each): keep pool_size near the process's busy threads, and the
    # sum over every process of pool_size + max_overflow (a worker's plus one: it renews leases on a
    # connection of its own) within Postgres's max_connections.
    pool_size: int = Field(default=20, ge=1)
    max_overflow: int = Field(default=30, ge=0)


class Settings(BaseSettings):
    """All of nanofleet's configuration."""

    model_config = SettingsConfigDict(
        env_prefix="NANOFLEET_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/nanofleet"
    redis_url: str = "redis://127.0.0.1:6379/0"
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    api_keys: list[SecretStr] = Field(default_factory=list, examples=[["a-long-random-key"]])
    workspace: Path = Path("~/.nanofleet/workspace")
    data_dir: Path = Path("~/.nanofleet")
    log_level: str = "INFO"
    log_json: bool = True
    llm: LLMSettings = Field(default_factory=LLMSettings)
    tools: ToolsSettings = Field(default_factory=ToolsSettings)
    permissions: PermissionsSettings = Field(default_factory=PermissionsSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    subagents: SubagentSettings = Field(default_factory=SubagentSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    channels: ChannelsSettings = Field(default_factory=ChannelsSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    heartbeat: HeartbeatSettings = Field(default_factory=HeartbeatSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @model_validator(mode="before")
    @classmethod
    def _env_names(cls, data: Any) -> Any:
        env_names_as_given(data, os.environ)
        return data

    @field_validator("database_url")
    @classmethod
    def _check_db(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        if not sep or scheme not in POSTGRES_SCHEMES:
            raise ValueError("must be a PostgreSQL URL: postgresql+psycopg://, postgresql:// or postgres:// "
                             "(the last two are read as postgresql+psycopg://)")
        no_fragment(v)
        shipped_password(v, compose_variable="POSTGRES_PASSWORD")
        return f"postgresql+psycopg://{rest}"

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, v: str) -> str:
        if v.upper() not in LOG_LEVELS:  # (logging would raise in every process as it starts)
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return v.upper()

    @field_validator("redis_url")
    @classmethod
    def _check_redis(cls, v: str) -> str:
        no_fragment(v)
        if problem := redis_url_problem(v):
            raise ValueError(problem)
        shipped_password(v, compose_variable="REDIS_PASSWORD")
        return v

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        """An empty key matches nothing (no key could open the API, and nothing said why); one with a
        space could never be sent in a header."""
        for key in v:
            not_placeholder(key)
            value = key.get_secret_value()
            if not value or value != "".join(value.split()):
                raise ValueError("an API key must not be empty or hold spaces (make one: python -c \"import "
                                 "secrets;print(secrets.token_urlsafe(32))\")")
        return v

    @field_validator("workspace", "data_dir", mode="before")
    @classmethod
    def _not_blank(cls, v: Any) -> Any:
        """An empty path is the current directory: files written wherever the command was started."""
        if isinstance(v, str) and not v.strip():
            raise ValueError("is empty: name a directory, or leave it unset for the default")
        return v

    @field_validator("workspace", "data_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            if not Path(config_file).is_file():
                raise SettingsError(f"{CONFIG_FILE_ENV}: no such file: {config_file}")
            try:
                sources += (TomlConfigSettingsSource(settings_cls, toml_file=config_file),)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as err:
                raise SettingsError(f"{CONFIG_FILE_ENV}: {config_file} is not a readable TOML file: {err}") from None
        return sources

    def secrets(self) -> list[str]:
        """Every configured secret value, for log redaction. Of the variables given to commands and MCP
        servers and their HTTP headers, those that look like one: every `LOG_LEVEL=error` made each
        "error" in the logs "***"."""
        found: list[str] = []

        def walk(obj: object) -> None:
            if isinstance(obj, SecretStr):
                found.append(obj.get_secret_value())
            elif isinstance(obj, BaseModel):
                for name in type(obj).model_fields:
                    walk(getattr(obj, name))
            elif isinstance(obj, dict):
                for name, item in obj.items():
                    if not isinstance(item, SecretStr) or looks_secret(str(name), item.get_secret_value()):
                        walk(item)
            elif isinstance(obj, list):
                for item in obj:
                    walk(item)

        walk(self)
        passwords = [p for p in (urlsplit(url).password for url in (self.database_url, self.redis_url)) if p]
        found += [form for p in passwords for form in (p, unquote(p))]  # in a URL, as given and decoded
        return [s for s in found if len(s) >= 4]


def no_fragment(url: str) -> None:
    """A '#' in a URL starts its fragment for every reader but SQLAlchemy, which took it for part of a
    password: that password was then printed whole in errors, or split into a 'port'."""
    if "#" in url:
        raise ValueError("holds a '#': percent-encode it (%23), in a password say")


def load_settings(**overrides: object) -> Settings:
    """Build Settings or raise SettingsError naming every bad variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        file = os.environ.get(CONFIG_FILE_ENV)
        raise SettingsError(describe_validation(err, environ=os.environ, config_file=file)) from None
    except SourceError as err:  # a value that should be JSON and is not
        raise SettingsError(describe_unparsable(Settings, os.environ, err)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide Settings, built once."""
    return load_settings()
