"""`python -m bench.uncapped -A workers.app:app worker ...`: a Celery worker whose LLM HTTP pool is
not capped at httpx's default 100 connections. Bench-only: item 3's second hold test measures what
the worker could hold with that one limit lifted (litellm builds its OpenAI-compatible sync client
with httpx's defaults; see litellm/llms/openai/common_utils.py:_get_sync_http_client)."""

from __future__ import annotations

import sys

import httpx
import litellm
from celery.__main__ import main

POOL = 4000

if __name__ == "__main__":
    litellm.client_session = httpx.Client(limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL),
                                          follow_redirects=True)
    sys.argv = ["celery", *sys.argv[1:]]
    main()
