"""`nanofleet channels ...`: platform set-up from the command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

app = typer.Typer(help="Chat platform set-up.", no_args_is_help=True)
telegram = typer.Typer(help="Telegram.", no_args_is_help=True)
app.add_typer(telegram, name="telegram")
discord = typer.Typer(help="Discord.", no_args_is_help=True)
app.add_typer(discord, name="discord")


def _exit(message: str, code: int) -> typer.Exit:
    typer.echo(f"nanofleet: {message}", err=True)
    return typer.Exit(code)


def _call(done: Callable[[], str], failed: str, where: str) -> None:
    """Print what `done()` says; when it fails, why and `where` it tried (named by its API base
    setting: no token in it), and exit 1."""
    try:
        typer.echo(done())
    except Exception as err:
        raise _exit(f"{failed}: {err} ({where})", 1) from None


@telegram.command("set-webhook")
def set_webhook(
    url: Annotated[str, typer.Argument(metavar="URL", help="public HTTPS URL of POST /webhooks/telegram")],
    drop_pending: Annotated[bool, typer.Option(help="discard updates Telegram queued meanwhile")] = False,
) -> None:
    """Point the bot at URL, with NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET as its secret token,
    and list the in-chat commands (/new, /stop, ...) in the bot's command menu."""
    from gateway.cli import settings_or_exit  # the main CLI imports this module
    from shared.agent.service import COMMANDS
    from shared.channels.telegram import TelegramChannel

    ch = TelegramChannel(settings_or_exit())
    if missing := ch.missing():
        raise _exit(f"set {', '.join(missing)} first", 2)
    if not url.startswith("https://"):
        raise _exit("Telegram only calls https:// webhook URLs", 2)
    menu = " ".join(f"/{name}" for name in COMMANDS)
    _call(lambda: f"telegram: {ch.set_webhook(url, drop_pending=drop_pending, commands=COMMANDS)}; menu: {menu}",
          "setting up the bot failed",  # (the error names the call: setWebhook or setMyCommands)
          f"the Bot API at {ch.cfg.api_base} (NANOFLEET_CHANNELS__TELEGRAM__API_BASE)")


@discord.command("register")
def register() -> None:
    """Create or update the /ask slash command (a question, a photo or file, or both) with
    NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN; the application's other commands stay."""
    from gateway.cli import settings_or_exit  # the main CLI imports this module
    from shared.channels.discord import DiscordChannel

    ch = DiscordChannel(settings_or_exit())
    if missing := [*ch.missing(), *([] if ch.secret("bot_token") else ["NANOFLEET_CHANNELS__DISCORD__BOT_TOKEN"])]:
        raise _exit(f"set {', '.join(missing)} first", 2)
    _call(lambda: f"discord: /ask registered (command {ch.register()})", "registering /ask failed",
          f"the Discord API at {ch.cfg.api_base} (NANOFLEET_CHANNELS__DISCORD__API_BASE)")
