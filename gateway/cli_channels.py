"""`nanofleet channels ...`: platform set-up from the command line."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Chat platform set-up.", no_args_is_help=True)
telegram = typer.Typer(help="Telegram.", no_args_is_help=True)
app.add_typer(telegram, name="telegram")
discord = typer.Typer(help="Discord.", no_args_is_help=True)
app.add_typer(discord, name="discord")


@telegram.command("set-webhook")
def set_webhook(
    url: Annotated[str, typer.Argument(metavar="URL", help="public HTTPS URL of POST /webhooks/telegram")],
    drop_pending: Annotated[bool, typer.Option(help="discard updates Telegram queued meanwhile")] = False,
) -> None:
    """Point the bot at URL, with NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET as its secret token."""
    from gateway.cli import settings_or_exit  # the main CLI imports this module
    from shared.channels.telegram import TelegramChannel

    ch = TelegramChannel(settings_or_exit())
    if missing := ch.missing():
        typer.echo(f"nanofleet: set {', '.join(missing)} first", err=True)
        raise typer.Exit(2)
    if not url.startswith("https://"):
        typer.echo("nanofleet: Telegram only calls https:// webhook URLs", err=True)
        raise typer.Exit(2)
    try:
        typer.echo(f"telegram: {ch.set_webhook(url, drop_pending=drop_pending)}")
    except Exception as err:
        where = f"the Bot API at {ch.cfg.api_base} (NANOFLEET_CHANNELS__TELEGRAM__API_BASE)"  # no token in it
        typer.echo(f"nanofleet: setWebhook failed: {err} ({where})", err=True)
        raise typer.Exit(1) from None


@discord.command("register")
def register() -> None:
    """Create or update the /ask slash command (a question, a photo or file, or both) with
    NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN; the application's other commands stay."""
    from gateway.cli import settings_or_exit  # the main CLI imports this module
    from shared.channels.discord import DiscordChannel

    ch = DiscordChannel(settings_or_exit())
    if missing := [*ch.missing(), *([] if ch.secret("bot_token") else ["NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN"])]:
        typer.echo(f"nanofleet: set {', '.join(missing)} first", err=True)
        raise typer.Exit(2)
    try:
        typer.echo(f"discord: /ask registered (command {ch.register()})")
    except Exception as err:
        where = f"the Discord API at {ch.cfg.api_base} (NANOFLEET_CHANNELS__DISCORD__API_BASE)"  # no token in it
        typer.echo(f"nanofleet: registering /ask failed: {err} ({where})", err=True)
        raise typer.Exit(1) from None
