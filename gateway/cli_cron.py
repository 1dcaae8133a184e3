"""`nanofleet cron list|add|remove|enable|disable`: scheduled jobs from the command line (Postgres, then the
beat mirror)."""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from shared.db import session_scope
from shared.errors import NanofleetError
from shared.models import CronJob
from shared.scheduling import jobs
from shared.scheduling.beat import BeatMirror, beat_app
from shared.settings import Settings

app = typer.Typer(help="Scheduled jobs: their results go to a chat (for api: a conversation, or their own session).",
                  no_args_is_help=True)
JobId = Annotated[str, typer.Argument(metavar="JOB_ID", help="the job's id (see `nanofleet cron list`)")]


# The core names the schedule's fields; the CLI names its own flags.
_FLAGS = {"every_seconds": "--every", "cron_expr": "--cron", "chat_id": "--chat-id", "missed_policy": "--missed-policy",
          "tz": "--tz"}
# What --at takes: what pydantic reads as a datetime (the REST API's `at`), where the pieces in [] may be left out.
_AT_FORMS = ("must be an ISO-8601 time ({error}): 2027-01-01T10:00[:SS[.ffffff]][Z|+-HH:MM], with a space or T, "
            "or a date alone; without an offset it is read in --tz")
# What a flag's value must be, by pydantic's error type (others: pydantic's own words).
_MUST = {"greater_than_equal": "must be at least {ge}", "less_than_equal": "must be at most {le}",
         "literal_error": "must be {expected}", "string_too_short": "must not be empty",
         "string_too_long": "must be at most {max_length} characters",
         "datetime_from_date_parsing": _AT_FORMS, "datetime_parsing": _AT_FORMS}


def _settings() -> Settings:
    """Settings whose database answers and is at this code's revision (else a one-line reason and exit 1)."""
    from gateway.cli import database_or_exit, migrated_or_exit, settings_or_exit  # the main CLI imports this one

    return migrated_or_exit(database_or_exit(settings_or_exit(misspelt=True)))


def _in_flags(message: str) -> str:
    return re.sub(r"\b(" + "|".join(_FLAGS) + r")\b", lambda m: _FLAGS[m.group(1)], message)


def flag_error(e: ErrorDetails) -> str:
    """An invalid value in a line naming its flag (pydantic's own text names the model and links its
    docs). `nanofleet agent` names its flags with it too."""
    field = str(e["loc"][0]) if e["loc"] else ""
    flag = _FLAGS.get(field, "--" + field.replace("_", "-"))
    if e["type"] in _MUST:
        return f"{flag}: {_MUST[e['type']].format(**e.get('ctx', {}))}"
    return f"{flag}: {e['msg'][:1].lower()}{e['msg'][1:]}"


def _mirror(settings: Settings, job: CronJob | None, job_id: str) -> None:
    try:
        mirror = BeatMirror(beat_app(settings))
        if job is None:
            mirror.disarm(job_id)
        else:
            jobs.sync(mirror, job)
    except Exception as err:
        typer.echo(f"note: the beat schedule was not updated now ({err}); beat will catch up", err=True)


def _schedule(view: dict[str, object]) -> str:
    if view["kind"] == "every":
        return f"every {view['everySeconds']}s"
    if view["kind"] == "cron":
        return f"{view['cronExpr']} ({view['tz']})"
    return f"at {view['at']}"


@app.command("list")
def list_jobs(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Show every job with its schedule, next run and target."""
    settings = _settings()
    with session_scope(settings.database_url) as s:
        views = [jobs.view(j) for j in jobs.listing(s)]
    if as_json:
        typer.echo(json.dumps(views, indent=2))
        return
    if not views:
        typer.echo("no cron jobs")
    for v in views:
        state = "on " if v["enabled"] else "off"
        target = f"{v['channel']}:{v['chatId']}" if v["chatId"] else str(v["channel"])
        typer.echo(f"{v['id']}  {state}  {_schedule(v):<28} next {v['nextRunAt'] or '-':<26} "
                   f"-> {target:<20} {v['name']}")


@app.command()
def add(
    message: Annotated[str, typer.Option("--message", "-m", help="what the agent does at each run")],
    every: Annotated[int | None, typer.Option(help="run every N seconds")] = None,
    cron: Annotated[str | None, typer.Option(help="5-field cron expression, e.g. '0 9 * * 1-5'")] = None,
    tz: Annotated[str | None, typer.Option(help="IANA timezone for --cron, or a --at without offset")] = None,
    at: Annotated[str | None, typer.Option(
        help="run once at this ISO-8601 time (as the REST API reads it; without an offset: in --tz)",
        metavar="<datetime>")] = None,
    name: Annotated[str, typer.Option(help="a short name")] = "",
    channel: Annotated[str, typer.Option(help="where results go: api, or a configured platform")] = "api",
    chat_id: Annotated[str, typer.Option(help="the chat on that channel (for api: a conversation id, or none)")] = "",
    missed_policy: Annotated[str | None, typer.Option(help="skip, run_once or catch_up")] = None,
) -> None:
    """Schedule a job."""
    if sum(x is not None for x in (every, cron, at)) != 1:
        typer.echo("nanofleet: give exactly one of --every, --cron or --at", err=True)
        raise typer.Exit(2)
    # A blank message is refused as an empty one: each run would ask the agent nothing (min_length lets it by).
    message = message if message.strip() else ""
    try:
        data = jobs.JobIn.model_validate({
            "message": message, "name": name, "every_seconds": every, "cron_expr": cron, "tz": tz, "at": at,
            "channel": channel, "chat_id": chat_id, "missed_policy": missed_policy,
        })
    except ValidationError as err:
        for e in err.errors():
            typer.echo(f"nanofleet: {flag_error(e)}", err=True)
        raise typer.Exit(2) from None
    settings = _settings()
    try:
        with session_scope(settings.database_url) as s:
            job = jobs.create(s, settings, data)
            view = jobs.view(job)
    except (NanofleetError, ValueError) as err:
        typer.echo(f"nanofleet: {_in_flags(str(getattr(err, 'message', err)))}", err=True)
        raise typer.Exit(2) from None
    _mirror(settings, job, job.id)
    typer.echo(f"added {view['id']}: {_schedule(view)}, next run {view['nextRunAt']}")


@app.command()
def remove(job_id: JobId) -> None:
    """Delete a job."""
    settings = _settings()
    try:
        with session_scope(settings.database_url) as s:
            jobs.delete(s, jobs.get(s, job_id, lock=True))
    except NanofleetError as err:
        typer.echo(f"nanofleet: {err.message}", err=True)
        raise typer.Exit(1) from None
    _mirror(settings, None, job_id)
    typer.echo(f"removed {job_id}")


def _switch(job_id: str, *, enabled: bool) -> None:
    """The REST PATCH's core: the job changes in Postgres, then the beat schedule follows."""
    settings = _settings()
    try:
        with session_scope(settings.database_url) as s:
            job = jobs.update(s, settings, jobs.get(s, job_id, lock=True), jobs.JobPatch(enabled=enabled))
            view = jobs.view(job)
    except NanofleetError as err:
        typer.echo(f"nanofleet: {err.message}", err=True)
        raise typer.Exit(1) from None
    _mirror(settings, job, job_id)
    typer.echo(f"enabled {job_id}: next run {view['nextRunAt']}" if enabled else f"disabled {job_id}")


@app.command()
def enable(job_id: JobId) -> None:
    """Switch a job on again: it counts from now (runs missed while it was off are not made up)."""
    _switch(job_id, enabled=True)


@app.command()
def disable(job_id: JobId) -> None:
    """Switch a job off; it stays listed until removed."""
    _switch(job_id, enabled=False)
