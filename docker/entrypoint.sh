#!/bin/sh
# Entrypoint of the nanofleet image. The first argument picks the role:
#   gateway|worker|beat|migrate|status|up|agent|...  -> nanofleet <args>
#   flower [flower options]                          -> celery -A workers.flower:app flower
#   celery|python|python3|alembic|sh|bash ...        -> run as given (debugging, one-off jobs)
# Every branch uses exec, so the process (or tini, with compose's `init: true`) receives the
# container's SIGTERM directly and can shut down warmly.
set -eu

if [ "$#" -eq 0 ]; then
    set -- gateway --host 0.0.0.0
fi

case "$1" in
    flower)
        shift
        # Basic auth comes from FLOWER_BASIC_AUTH (user:password[,user2:password2]); Flower reads
        # any FLOWER_<OPTION> variable itself. Refuse to expose an unauthenticated dashboard.
        if [ -z "${FLOWER_BASIC_AUTH:-}" ]; then
            echo "entrypoint: FLOWER_BASIC_AUTH is not set (user:password); refusing to start Flower" >&2
            exit 64
        fi
        if [ "$FLOWER_BASIC_AUTH" = "admin:change-me-now" ]; then
            echo "entrypoint: FLOWER_BASIC_AUTH is the shipped example; set your own before exposing Flower" >&2
        fi
        exec celery -A workers.flower:app flower --port=5555 "$@"
        ;;
    celery|python|python3|alembic|sh|bash)
        exec "$@"
        ;;
    *)
        exec nanofleet "$@"
        ;;
esac
