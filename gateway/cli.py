"""The `nanofleet` command line."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from gateway.cli_channels import app as channels_app
from gateway.cli_cron import app as cron_app
from shared.constants import QUEUES
from shared.settings import Settings, SettingsError, get_settings

POOLS = ("threads", "prefork", "solo")  # Celery pools the workers are built and tested for

app = typer.Typer(help="nanofleet: a self-hosted AI agent runtime.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(channels_app, name="channels")
app.add_typer(cron_app, name="cron")


def settings_or_exit() -> Settings:
    """Load settings; a bad one stops start-up with a message naming it."""
    try:
        return get_settings()
    except SettingsError as err:
        typer.echo(f"nanofleet: {err}", err=True)
        raise typer.Exit(2) from None


@app.command()
def gateway(host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
    """Run the HTTP gateway (REST API, webhooks, SSE)."""
    import uvicorn

    settings_or_exit()
    uvicorn.run("gateway.app:factory", factory=True, host=host, port=port, workers=workers,
                log_config=None, proxy_headers=True, access_log=False)


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="comma-separated queues")] = ",".join(QUEUES),
    concurrency: int = 32,
    pool: Annotated[str, typer.Option(help="threads, prefork or solo")] = "threads",
    hostname: str | None = None,
) -> None:
    """Run a Celery worker for some or all queues."""
    settings_or_exit()
    unknown = set(queues.split(",")) - set(QUEUES)
    if unknown:
        typer.echo(f"nanofleet: unknown queue(s) {', '.join(sorted(unknown))}; known: {', '.join(QUEUES)}", err=True)
        raise typer.Exit(2)
    if pool not in POOLS:
        typer.echo(f"nanofleet: unknown pool {pool!r}; known: {', '.join(POOLS)}", err=True)
        raise typer.Exit(2)
    name = hostname or f"nanofleet-{queues.replace(',', '-')}@%h"
    argv = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", "-Q", queues,
            "-c", str(concurrency), "-P", pool, "-n", name, "-E", "--without-mingle", "--without-gossip"]
    os.execvp(argv[0], argv)


@app.command()
def beat() -> None:
    """Run the scheduler (exactly one per deployment; a second one waits for the lock)."""
    settings_or_exit()
    argv = [sys.executable, "-m", "celery", "-A", "workers.beat:app", "beat", "-S", "redbeat.RedBeatScheduler",
            "--max-interval", "1"]
    os.execvp(argv[0], argv)


@app.command()
def migrate() -> None:
    """Create the database if needed and apply migrations (safe to run again)."""
    from shared.migrate import current, upgrade

    settings = settings_or_exit()
    upgrade(settings.database_url)
    typer.echo(f"database at revision {current(settings.database_url)}")


@app.command()
def status() -> None:
    """Show the database, Redis, live workers and queue depths."""
    from gateway.status import report

    ok = report(settings_or_exit(), typer.echo)
    raise typer.Exit(0 if ok else 1)


@app.command()
def up(
    host: str = "127.0.0.1",
    port: int = 8000,
    concurrency: int = 32,
    embedded: Annotated[bool, typer.Option(help="use embedded Redis/PostgreSQL even if local ones answer")] = False,
) -> None:
    """Everything on one machine: migrations, gateway, a worker for all queues, beat.
    Without NANOFLEET_REDIS_URL / NANOFLEET_DATABASE_URL and nothing on the default ports,
    embedded servers start under the data dir."""
    from gateway.supervisor import run_all

    code = run_all(settings_or_exit(), host=host, port=port, concurrency=concurrency, embedded=embedded)
    raise typer.Exit(code)


@app.command()
def agent(
    message: Annotated[str, typer.Option("-m", "--message", help="what to say")],
    session: Annotated[str, typer.Option(help="conversation to continue")] = "cli:default",
    model: str | None = None,
) -> None:
    """One turn in-process (no broker); prints the reply. Exits 1 when the turn failed."""
    from gateway.local_agent import one_turn

    if not message.strip():
        raise typer.BadParameter("say something", param_hint="'-m' / '--message'")
    answer = one_turn(settings_or_exit(), message=message, session=session, model=model)
    typer.echo(answer.text)
    raise typer.Exit(0 if answer.ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
