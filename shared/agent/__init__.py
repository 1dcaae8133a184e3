"""The agent runtime: runs advanced by short, idempotent steps over Postgres state."""
