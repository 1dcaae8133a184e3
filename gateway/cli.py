"""The `nanofleet` command line."""

from __future__ import annotations

import os
import secrets
import sys
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from gateway.cli_channels import app as channels_app
from gateway.cli_cron import app as cron_app
from gateway.cli_cron import flag_error
from shared.constants import QUEUES, REDBEAT_PREFIX
from shared.process_guard import guard_or_warn, start_resource_tracker
from shared.settings import Settings, SettingsError, get_settings

if TYPE_CHECKING:
    from shared.db import DatabaseRefused
    from shared.migrate import ForeignDatabase, MigrationBlocked, UnknownRevision

POOLS = ("threads", "prefork", "solo")  # Celery pools the workers are built and tested for
MAX_CONCURRENCY = 5000  # threads (or processes) a worker starts: more is a typo, not a deployment
# A TCP port, 0 for any free one (the resolver took 99999 as 34463 and the gateway listened there, saying 99999)
Port = Annotated[int, typer.Option(min=0, max=65535)]

# Plain help (no rich panels): those show a type even for flags, `--help <bool>`.
app = typer.Typer(help="nanofleet: a self-hosted AI agent runtime.", no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
app.add_typer(channels_app, name="channels")
app.add_typer(cron_app, name="cron")


def settings_or_exit(*, misspelt: bool = False) -> Settings:
    """Load settings; a bad one stops start-up with a message naming it. This process's connections
    say `nanofleet-cli` in pg_stat_activity. `misspelt`: warn of variables that look like settings but
    are none (commands that build no tool registry, which warns of them itself)."""
    from shared import db, startup_checks

    try:
        settings = get_settings()
    except SettingsError as err:
        typer.echo(f"nanofleet: {err}", err=True)
        raise typer.Exit(2) from None
    if misspelt:
        startup_checks.warn_misspelt()
    db.configure(settings.database, role="cli")  # `gateway` runs on in this process, and says so again
    return settings


def plugins_or_exit(settings: Settings) -> Settings:
    """`settings`, unless a tool plugin does not load: the gateway, a worker and `agent` need them
    all (beat and `status` go on without; docs/tools.md)."""
    from shared.tools import check_plugins

    try:
        check_plugins(settings)
    except SettingsError as err:
        typer.echo(f"nanofleet: {err}", err=True)
        raise typer.Exit(2) from None
    return settings


def refuse(err: Exception | str) -> NoReturn:
    """Say why a command cannot go on, in a line, and exit 1 (no traceback)."""
    typer.echo(f"nanofleet: {err}", err=True)
    raise typer.Exit(1)


def bad_argument(*reasons: str) -> NoReturn:
    """Say what is wrong with the arguments, a line each, and exit 2 (as for a bad setting), before
    anything is done: no usage text, no traceback."""
    for reason in reasons:
        typer.echo(f"nanofleet: {reason}", err=True)
    raise typer.Exit(2)


def database_or_exit(settings: Settings, *, may_create: bool = False) -> Settings:
    """`settings`, once its database answers (with `may_create`, once its server does)."""
    from gateway.status import Unavailable, require_database

    try:
        require_database(settings.database_url, may_create=may_create)
    except Unavailable as err:
        refuse(err)
    return settings


def migrated_or_exit(settings: Settings) -> Settings:
    """`settings`, unless its database is missing, never migrated, or behind this code's revision: a
    process on it would fail at its first query (a newer nanofleet's is served: a rolling upgrade).
    A server that does not answer is not refused here (the process starts, and /readyz names it)."""
    from gateway.status import migration_problem

    if (problem := migration_problem(settings.database_url)) is not None:
        refuse(problem)
    return settings


def _not_migrated(err: UnknownRevision | ForeignDatabase | DatabaseRefused | MigrationBlocked) -> NoReturn:
    """A database a newer nanofleet migrated or another application's, a privilege or a table name
    Postgres refused migrations, or a migration another transaction's lock stopped."""
    from gateway.status import masked
    from shared.db import DatabaseRefused
    from shared.migrate import MigrationBlocked

    if isinstance(err, MigrationBlocked):
        refuse(err)
    refuse(f"the database at {masked(err.url)}{':' if isinstance(err, DatabaseRefused) else ''} {err}")


@app.command()
def gateway(host: str = "127.0.0.1", port: Port = 8000,
            workers: Annotated[int, typer.Option(min=1)] = 1) -> None:
    """Run the HTTP gateway (REST API, webhooks, SSE)."""
    import uvicorn

    from gateway.status import port_problem

    settings = plugins_or_exit(settings_or_exit())
    if (problem := port_problem(host, port)) is not None:
        refuse(problem)
    migrated_or_exit(settings)
    if workers > 1:
        start_resource_tracker()  # uvicorn spawns its workers, which would start it with our environment
    uvicorn.run("gateway.app:factory", factory=True, host=host, port=port, workers=workers,
                log_config=None, proxy_headers=True, access_log=False)


def node_name(queues: list[str]) -> str:
    """A Celery node name of its own for this worker process: its queues, then its pid (exec keeps it,
    so it is the worker's) and a random tag, since two workers for the same queues on one host are a
    plain way to scale, and containers sharing the host's name (host networking) may share a pid too.
    A shared name merges them in `celery inspect`, Flower and remote control."""
    return f"nanofleet-{'-'.join(queues)}-{os.getpid()}-{secrets.token_hex(2)}@%h"


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="comma-separated queues")] = ",".join(QUEUES),
    concurrency: Annotated[int, typer.Option(min=1, max=MAX_CONCURRENCY)] = 32,
    pool: Annotated[str, typer.Option(help="threads, prefork or solo")] = "threads",
    hostname: Annotated[str | None, typer.Option(
        help="Celery node name, passed as given (default: nanofleet-<queues>-<pid>-<tag>@%h)")] = None,
) -> None:
    """Run a Celery worker for some or all queues."""
    settings = plugins_or_exit(settings_or_exit())
    names = [name.strip() for name in queues.split(",") if name.strip()]
    unknown = set(names) - set(QUEUES)
    if unknown or not names:
        what = f"unknown queue(s) {', '.join(sorted(unknown))}" if unknown else "no queue given"
        typer.echo(f"nanofleet: {what}; known: {', '.join(QUEUES)}", err=True)
        raise typer.Exit(2)
    if pool not in POOLS:
        typer.echo(f"nanofleet: unknown pool {pool!r}; known: {', '.join(POOLS)}", err=True)
        raise typer.Exit(2)
    migrated_or_exit(settings)
    queues = ",".join(names)
    argv = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", "-Q", queues,
            "-c", str(concurrency), "-P", pool, "-n", hostname or node_name(names), "--without-mingle",
            "--without-gossip"]
    os.execvp(argv[0], argv)


def _say_if_standby(settings: Settings) -> None:
    """redbeat waits for another beat's lock without a word (its log line is at debug level)."""
    import redis

    key = f"{REDBEAT_PREFIX}:lock"  # redbeat's lock: its key prefix + ":lock"
    try:
        with redis.Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=2) as client:
            held = bool(client.exists(key))
    except redis.RedisError:
        return  # beat says so itself
    if held:
        typer.echo(f"nanofleet: another beat holds the lock {key}; this one waits for it: it takes over "
                   f"when that one stops (at most {settings.scheduler.beat_lock_timeout}s after it dies)", err=True)


def _wait_for_redis(settings: Settings, *, pause: float = 1.0, longest: float = 10.0) -> None:
    """Return once Redis answers, saying once that beat waits for it: celery beat exits at once
    without it, and `up`, which starts beat again after an outage, took that for a crash loop and
    stopped everything. A refused password is no outage: refused, in a line."""
    import time

    import redis

    from gateway.status import masked

    told = False
    while True:
        try:
            with redis.Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=2) as client:
                client.ping()
        except redis.AuthenticationError as err:
            refuse(f"Redis at {masked(settings.redis_url)} refused beat: {err}")
        except (redis.ConnectionError, redis.TimeoutError) as err:
            if not told:
                typer.echo(f"nanofleet: Redis at {masked(settings.redis_url)} does not answer ({err}); beat waits "
                           "for it", err=True)
                told = True
            time.sleep(pause)
            pause = min(pause * 2, longest)
            continue
        except redis.RedisError as err:  # no Redis at that port, or no such database number: no outage either
            refuse(f"Redis at {masked(settings.redis_url)} refused beat: {err} (check NANOFLEET_REDIS_URL)")
        if told:
            typer.echo("nanofleet: Redis answers; beat starts", err=True)
        return


@app.command()
def beat() -> None:
    """Run the scheduler (exactly one per deployment; a second one waits for the lock, and one started
    while Redis is down waits for Redis)."""
    settings = migrated_or_exit(settings_or_exit(misspelt=True))
    _wait_for_redis(settings)
    _say_if_standby(settings)
    argv = [sys.executable, "-m", "celery", "-A", "workers.beat:app", "beat", "-S", "workers.beat:Scheduler",
            "--max-interval", "1"]
    os.execvp(argv[0], argv)


@app.command()
def migrate() -> None:
    """Create the database if needed and apply migrations (safe to run again)."""
    from gateway.status import masked
    from shared.db import DatabaseRefused
    from shared.migrate import ForeignDatabase, MigrationBlocked, UnknownRevision, current, upgrade

    settings = database_or_exit(settings_or_exit(misspelt=True), may_create=True)
    try:
        if upgrade(settings.database_url):
            typer.echo(f"created the database at {masked(settings.database_url)}")
    except UnknownRevision as err:  # not a failure: compose starts nothing after a failed migrate
        typer.echo(f"nanofleet: the database at {masked(err.url)} is at revision {err.revision}, which a newer "
                   "nanofleet migrated: left as it is (this version serves it, as in a rollback)", err=True)
        return
    except (ForeignDatabase, DatabaseRefused, MigrationBlocked) as err:
        _not_migrated(err)
    typer.echo(f"database at revision {current(settings.database_url)}")


@app.command()
def status() -> None:
    """Show the database, Redis, live workers and queue depths."""
    from gateway.status import report

    ok = report(settings_or_exit(misspelt=True), typer.echo)
    raise typer.Exit(0 if ok else 1)


@app.command()
def up(
    host: str = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="(not 0: up says where the gateway is)")] = 8000,
    concurrency: Annotated[int, typer.Option(min=1, max=MAX_CONCURRENCY)] = 32,
    embedded: Annotated[bool, typer.Option(help="use embedded Redis/PostgreSQL even if local ones answer")] = False,
) -> None:
    """Everything on one machine: migrations, gateway, a worker for all queues, beat.
    Without NANOFLEET_REDIS_URL / NANOFLEET_DATABASE_URL and nothing on the default ports,
    embedded servers start under the data dir, with passwords (their URLs are in
    <data dir>/embedded.env for other terminals). One per data dir."""
    from gateway.status import ServiceDown, Unavailable
    from gateway.supervisor import run_all
    from shared.db import DatabaseRefused
    from shared.migrate import ForeignDatabase, MigrationBlocked, UnknownRevision

    settings = settings_or_exit()
    try:
        code = run_all(settings, host=host, port=port, concurrency=concurrency, embedded=embedded)
    except Unavailable as err:
        typer.echo(f"nanofleet: {err}", err=True)
        field = err.setting.removeprefix("NANOFLEET_").lower() if isinstance(err, ServiceDown) else None
        if field is not None and field not in settings.model_fields_set and not embedded:
            typer.echo("nanofleet: or run `nanofleet up --embedded` to use servers of its own", err=True)
        raise typer.Exit(1) from None
    except (UnknownRevision, ForeignDatabase, DatabaseRefused, MigrationBlocked) as err:
        _not_migrated(err)
    raise typer.Exit(code)


def _agent_problems(*, message: str, session: str, model: str | None) -> list[str]:
    """What is wrong with `agent`'s arguments, a line each: a blank message or session (the session
    is the conversation's key and chat id), or what the REST API's chat body refuses (a model name
    too long, a message too long). Settings decide the rest about the model (`LLMSettings.refuses`)."""
    from pydantic import ValidationError

    from gateway.schemas import ChatIn

    said = [f"--{flag}: must not be empty" for flag, value in (("message", message), ("session", session))
            if not value.strip()]
    try:
        ChatIn.model_validate({"message": message, "model": model})
    except ValidationError as err:  # an empty message's error names no field: said above
        said += [flag_error(e) for e in err.errors() if e["loc"]]
    return said


@app.command()
def agent(
    message: Annotated[str, typer.Option("-m", "--message", help="what to say")],
    session: Annotated[str, typer.Option(help="conversation to continue")] = "cli:default",
    model: Annotated[str | None, typer.Option(
        help="the model for this turn: a profile name or a litellm model string (default: NANOFLEET_LLM__MODEL)",
    )] = None,
) -> None:
    """One turn in-process: needs PostgreSQL, not Redis or workers. Prints the reply; exits 1 when
    the turn failed."""
    from gateway.local_agent import log_to_stderr, one_turn
    from shared.db import DatabaseRefused
    from shared.migrate import ForeignDatabase, MigrationBlocked, UnknownRevision

    if said := _agent_problems(message=message, session=session, model=model):
        bad_argument(*said)
    settings = plugins_or_exit(settings_or_exit())
    if model and (refusal := settings.llm.refuses(model)):  # the REST API's check: 422 there
        bad_argument(refusal)
    settings = database_or_exit(settings, may_create=True)
    log_to_stderr(settings)
    try:
        answer = one_turn(settings, message=message, session=session, model=model)
    except (UnknownRevision, ForeignDatabase, DatabaseRefused, MigrationBlocked) as err:
        _not_migrated(err)
    typer.echo(answer.text)
    raise typer.Exit(0 if answer.ok else 1)


def main() -> None:
    # First: a command exec runs as this process's user must not read the secrets in its environment.
    guard_or_warn("nanofleet")
    app()


if __name__ == "__main__":
    main()
