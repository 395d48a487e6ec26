#!/bin/sh
# Container entrypoint: settle the ledger, then become the worker.
#
#   entrypoint.sh COMMAND [ARGS...]      e.g. entrypoint.sh celery -A proj worker
#
# TSG_DB         the ledger (required), e.g. /data/tsg/tasks.sqlite; tsg creates the 0700
#                directory and the database on a fresh volume.
# TSG_RECONCILE  "apply" (default): log the preview, then apply the reconcile here. At a start
#                either will do: each lost job's verdict is recorded in the ledger, and the
#                worker this script execs publishes it when it boots, before it consumes
#                (Celery FAILURE, Dramatiq Results, on_lost). (A `tsg reconcile` run later,
#                beside running workers, is published only by their periodic pass, off by
#                default: reconcile_interval_seconds=0. See docs/deploy.md.)
#                "preview": log the preview only and leave the applying to the worker's own
#                boot reconcile.
# TSG_ACTIVE_GRACE_SECONDS, TSG_DELIVERY_GRACE_SECONDS, TSG_BUSY_TIMEOUT_MS: as for tsg.
# TSG_EXPLAIN    "1" (the default here): tsg's error lines carry the reason (the README's
#                "Error reasons" table says what to do); "0" prints the bare 0.1.0 error line.
#
# Any failure (unsafe volume permissions, a ledger locked past the busy timeout, a damaged
# database) stops the container before the worker starts: the orchestrator restarts it and the
# logs show tsg's one-line JSON error with its reason. Every line tsg prints is counts only,
# never task ids.
set -eu

if [ "$#" -eq 0 ]; then
    echo "entrypoint: no command given (e.g. celery -A proj worker)" >&2
    exit 64
fi
if [ -z "${TSG_DB:-}" ]; then
    echo "entrypoint: set TSG_DB to the ledger path, e.g. /data/tsg/tasks.sqlite" >&2
    exit 64
fi
export TSG_EXPLAIN="${TSG_EXPLAIN:-1}"
mode="${TSG_RECONCILE:-apply}"
case "$mode" in
    apply | preview) ;;
    *)
        echo "entrypoint: TSG_RECONCILE must be apply or preview" >&2
        exit 64
        ;;
esac

# Create (fresh volume) or migrate the ledger: a preview needs one. Quiet unless it fails.
init_out=$(tsg init) || { status=$?; printf '%s\n' "$init_out"; exit "$status"; }
tsg reconcile --dry-run       # what a reconcile would do now, as counts
if [ "$mode" = apply ]; then
    tsg reconcile
fi
# exec: the worker replaces this shell, so it receives the container's SIGTERM itself.
exec "$@"
