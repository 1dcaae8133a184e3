"""What a NANOFLEET_REDIS_URL may say, checked where the settings are read; shared.broker turns it
into the broker's, the result backend's and redbeat's settings."""

from __future__ import annotations

import ssl
from urllib.parse import parse_qsl, urlsplit

REDIS_SCHEMES = ("redis", "rediss", "unix")  # unix:// is redis-py's form: unix://[:password@]/path?db=N
# What a rediss:// URL may say about TLS (redis-py's names; shared.broker hands them to Celery and redbeat).
REDIS_TLS_PARAMS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
# ssl_cert_reqs: the words redis-py takes (it reads the URL as it is, in the gateway and the tasks)
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def redis_url_problem(url: str) -> str | None:
    """Why the broker, the result backend or redbeat could not use `url`, or None."""
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        return "must be a redis://, rediss:// or unix:// URL (a socket: unix:///path/to/redis.sock?db=0)"
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.scheme != "rediss" and (tls := sorted(set(params) & set(REDIS_TLS_PARAMS))):
        return f"{', '.join(tls)} apply to a rediss:// URL only"
    if "ssl_cert_reqs" in params and params["ssl_cert_reqs"] not in CERT_REQS:
        return "ssl_cert_reqs must be required (the default), optional or none"
    if parts.scheme == "unix" and not parts.path.strip("/"):
        return "a unix:// URL names the socket's path: unix:///path/to/redis.sock?db=0"
    return None
