"""Outbound-queue tasks: deliver outbox rows to chat platforms."""

from __future__ import annotations
