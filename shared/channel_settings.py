"""Chat platform settings (one model per platform, and outbound delivery), and the placeholder
check that every secret setting passes."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, SecretStr, field_validator

PLACEHOLDERS = {"changeme", "change-me", "your-key-here", "xxx", "todo", "replace-me"}
TELEGRAM_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")  # what setWebhook's secret_token accepts
ED25519_HEX = re.compile(r"[0-9a-fA-F]{64}")


def not_placeholder(value: SecretStr | None) -> SecretStr | None:
    """A secret as given, unless it is a placeholder left from an example file."""
    if value is not None and value.get_secret_value().strip().lower() in PLACEHOLDERS:
        raise ValueError("is a placeholder; set a real secret or leave it unset")
    return value


class ChannelBase(BaseModel):
    """What every channel has: an API base and who may talk to the agent."""

    api_base: str = ""
    allow_from: list[str] = Field(default_factory=list, examples=[["*"]])

    @field_validator("allow_from", mode="before")
    @classmethod
    def _ids_as_text(cls, v: object) -> object:
        """User ids as given: Telegram's are numbers, so `[4242]` (or a bare `4242`) means `["4242"]`."""
        if isinstance(v, int) and not isinstance(v, bool):
            return [str(v)]
        if isinstance(v, list):
            return [str(x) if isinstance(x, int) and not isinstance(x, bool) else x for x in v]
        return v

    @field_validator("*")
    @classmethod
    def _check_secrets(cls, v: object) -> object:
        return not_placeholder(v) if isinstance(v, SecretStr) else v

    def started(self, required: tuple[str, ...]) -> bool:
        """Whether any of the `required` fields or any secret is set: someone meant to turn the
        platform on (when some required field is still unset, it is off, which is likely a mistake)."""
        any_secret = any(isinstance(getattr(self, f), SecretStr) for f in type(self).model_fields)
        return any_secret or any(getattr(self, f, None) not in (None, "") for f in required)


class ChatSettings(ChannelBase):
    """A chat platform's: people write there, in bursts at times."""

    # Seconds a text message waits for its sender's next one; those that come before a pause this long
    # are one message, answered once (shared.channels.debounce). 0: each is answered as it comes.
    debounce: float = Field(default=0.0, ge=0.0, le=30.0)


class TelegramSettings(ChatSettings):
    api_base: str = "https://api.telegram.org"
    token: SecretStr | None = None
    webhook_secret: SecretStr | None = None
    bot_username: str | None = None  # in groups, only mentions of it and replies to it are answered (unset: getMe)

    @field_validator("webhook_secret")
    @classmethod
    def _telegram_accepts(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not TELEGRAM_SECRET.fullmatch(v.get_secret_value()):
            raise ValueError("Telegram accepts 1-256 characters of A-Z a-z 0-9 _ - only "
                             "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return v


class SlackSettings(ChatSettings):
    api_base: str = "https://slack.com/api"
    bot_token: SecretStr | None = None
    signing_secret: SecretStr | None = None


class WhatsAppSettings(ChatSettings):
    api_base: str = "https://graph.facebook.com/v21.0"
    access_token: SecretStr | None = None
    app_secret: SecretStr | None = None
    verify_token: SecretStr | None = None
    phone_number_id: str | None = None


class FeishuSettings(ChatSettings):
    api_base: str = "https://open.feishu.cn/open-apis"
    app_id: str | None = None
    app_secret: SecretStr | None = None
    verification_token: SecretStr | None = None
    encrypt_key: SecretStr | None = None


class DiscordSettings(ChannelBase):
    api_base: str = "https://discord.com/api/v10"
    application_id: str | None = None
    public_key: str | None = None
    bot_token: SecretStr | None = None

    @field_validator("public_key")
    @classmethod
    def _ed25519_key(cls, v: str | None) -> str | None:
        """A key that is none (the application id, pasted by mistake) failed every request as a forged
        one, with nothing said at start."""
        if v and not ED25519_HEX.fullmatch(v.strip()):
            raise ValueError("is not an Ed25519 public key: 64 hexadecimal digits, the 'Public Key' on the "
                             "application's General Information page in the Discord developer portal")
        return v.strip() if v else v


class GenericWebhookSettings(ChannelBase):
    secret: SecretStr | None = None
    callback_url: str | None = None


class DeliverySettings(BaseModel):
    """How outbox rows are sent: timeouts, the per-row claim, retries, redelivery of lost tasks."""

    send_timeout: float = Field(default=10.0, gt=0)
    claim_seconds: float = Field(default=60.0, gt=0)  # a row being sent is another worker's only after this
    max_attempts: int = Field(default=10, ge=1)
    retry_base_delay: float = Field(default=2.0, ge=0)
    retry_max_delay: float = Field(default=300.0, ge=0)
    redeliver_after: float = Field(default=30.0, gt=0)  # a pending row untouched this long has lost its task


class ChannelsSettings(BaseModel):
    """Per-platform settings; a platform with no secrets configured is off."""

    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    # Keep the files users send in the workspace (inbox/<date>/<name>), and tell the model where: its
    # file tools and commands can then open what it could not read as text (shared.channels.saved).
    save_files: bool = False
    # Days a kept file stays in the inbox: a day's folder goes once it is older (the retention pass,
    # shared.housekeeping); 0 keeps them until someone deletes them.
    save_files_days: int = Field(default=0, ge=0)
    telegram: TelegramSettings = Field(default_factory=TelegramSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    whatsapp: WhatsAppSettings = Field(default_factory=WhatsAppSettings)
    feishu: FeishuSettings = Field(default_factory=FeishuSettings)
    discord: DiscordSettings = Field(default_factory=DiscordSettings)
    webhook: GenericWebhookSettings = Field(default_factory=GenericWebhookSettings)

    def debounce(self, channel: str) -> float:
        """The platform's debounce (ChatSettings); 0 where there is none (Discord answers each
        interaction it was sent, a webhook caller each message)."""
        settings = getattr(self, channel, None)
        return settings.debounce if isinstance(settings, ChatSettings) else 0.0
