#!/bin/sh
# Entrypoint of the nanofleet image. The first argument picks the role:
#   gateway|worker|beat|migrate|status|up|agent|...  -> nanofleet <args>
#   flower [flower options]                          -> celery -A workers.flower:app flower
#   celery|python|python3|alembic|sh|bash ...        -> run as given (debugging, one-off jobs)
# Every branch uses exec, so the process (or tini, with compose's `init: true`) receives the
# container's SIGTERM directly and can shut down warmly.
set -eu

# Passwords anyone can read in an example (shared/settings.py, SHIPPED_PASSWORDS: keep them the same).
SHIPPED_PASSWORDS="nanofleet change-me-now changeme change-me your-key-here xxx todo replace-me"

refuse_flower() {
    echo "entrypoint: FLOWER_BASIC_AUTH $1; refusing to start Flower. Set user:password in .env (a password" \
        "of your own), then: docker compose up -d flower" >&2
    exit 64
}

# Flower's API revokes tasks and shuts workers down behind basic auth only: no login may be empty
# or one from an example. FLOWER_BASIC_AUTH is user:password[,user2:password2].
check_flower_auth() {
    [ -n "${FLOWER_BASIC_AUTH:-}" ] || refuse_flower "is not set"
    set -f  # the split below must not expand * in a password
    old_ifs=$IFS
    IFS=,
    for pair in $FLOWER_BASIC_AUTH; do  # split once, here: IFS is the usual one in the body
        IFS=$old_ifs
        case "$pair" in
            *:*) ;;
            *) refuse_flower "must be user:password (several: a comma between them)" ;;
        esac
        user=${pair%%:*}
        password=${pair#*:}
        lowered=$(printf '%s' "$password" | tr '[:upper:]' '[:lower:]' | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
        if [ -z "$user" ] || [ -z "$lowered" ]; then
            refuse_flower "has an empty user or password"
        fi
        for shipped in $SHIPPED_PASSWORDS; do
            if [ "$lowered" = "$shipped" ]; then
                refuse_flower "has a password from an example anyone can read ('$password')"
            fi
        done
    done
    IFS=$old_ifs
    set +f
}

if [ "$#" -eq 0 ]; then
    set -- gateway --host 0.0.0.0
fi

case "$1" in
    flower)
        shift
        # Basic auth comes from FLOWER_BASIC_AUTH; Flower reads any FLOWER_<OPTION> variable itself.
        check_flower_auth
        exec celery -A workers.flower:app flower --port=5555 "$@"
        ;;
    celery|python|python3|alembic|sh|bash)
        exec "$@"
        ;;
    *)
        exec nanofleet "$@"
        ;;
esac
