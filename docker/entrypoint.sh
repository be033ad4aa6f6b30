#!/bin/sh
# The entry point of the mqtthub image: one role per container.
#
#   mqtthub brokerd        a broker node; every setting from BROKERD_* variables (README, brokerd flags)
#   mqtthub console        the web console under daphne on CONSOLE_HOST:CONSOLE_PORT; HTTPS when
#                          CONSOLE_TLS_CERT and CONSOLE_TLS_KEY name a certificate and its key
#   mqtthub worker         the Celery worker that runs the Spark reports
#   mqtthub beat           Celery beat: report schedules from the database
#   mqtthub migrate        database migrations, then the first administrator (CONSOLE_ADMIN_USER,
#                          CONSOLE_ADMIN_PASSWORD) if there is none; exits
#   mqtthub spark-master   a standalone Spark master (7077, web UI 8080) from pyspark's own Spark
#   mqtthub spark-worker   a Spark worker joining SPARK_MASTER
#   mqtthub healthcheck [ROLE]   the HEALTHCHECK of the image (docker/healthcheck.py)
#   mqtthub manage ARGS    manage.py ARGS
#
# Outside Docker the same script starts the same roles from a checkout, with the
# virtualenv's bin/ first on PATH (tests/deploy does so).
set -eu

APP_DIR=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$APP_DIR"
role=${1:-brokerd}
[ $# -gt 0 ] && shift

record_role() {
    echo "$role" > "${MQTTHUB_ROLE_FILE:-/tmp/mqtthub.role}" 2>/dev/null || true
}

spark_home() {
    python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

case "$role" in
    brokerd)
        record_role
        exec python -m brokerd "$@"
        ;;
    console)
        record_role
        host=${CONSOLE_HOST:-127.0.0.1}
        port=${CONSOLE_PORT:-8000}
        # no --proxy-headers: daphne would believe any client's X-Forwarded-For; the console
        # takes forwarded headers only from the proxies in TRUSTED_PROXIES (console/forwarded.py)
        if [ -n "${CONSOLE_TLS_CERT:-}" ]; then
            # twisted's endpoint syntax: ':' and '=' in paths would need escaping, so keep them plain
            exec python -m console.serve -e "ssl:port=$port:interface=$host:privateKey=${CONSOLE_TLS_KEY:?CONSOLE_TLS_KEY is needed with CONSOLE_TLS_CERT}:certKey=$CONSOLE_TLS_CERT" \
                "$@" console.asgi:application
        fi
        exec python -m console.serve -b "$host" -p "$port" "$@" console.asgi:application
        ;;
    worker)
        record_role
        exec celery -A console worker -P threads -c "${REPORTS_WORKER_CONCURRENCY:-2}" \
            --without-mingle --without-gossip -l "${LOG_LEVEL:-info}" "$@"
        ;;
    beat)
        record_role
        exec celery -A console beat -l "${LOG_LEVEL:-info}" --pidfile= "$@"
        ;;
    migrate)
        python manage.py migrate --noinput "$@"
        exec python manage.py console_bootstrap
        ;;
    spark-master)
        record_role
        exec "$(spark_home)/bin/spark-class" org.apache.spark.deploy.master.Master \
            --host "${SPARK_MASTER_HOST:-$(hostname)}" --port "${SPARK_MASTER_PORT:-7077}" \
            --webui-port "${SPARK_MASTER_WEBUI_PORT:-8080}" "$@"
        ;;
    spark-worker)
        record_role
        exec "$(spark_home)/bin/spark-class" org.apache.spark.deploy.worker.Worker \
            --webui-port "${SPARK_WORKER_WEBUI_PORT:-8081}" "$@" "${SPARK_MASTER:?SPARK_MASTER=spark://HOST:7077 is needed}"
        ;;
    healthcheck)
        exec python docker/healthcheck.py "$@"
        ;;
    manage)
        exec python manage.py "$@"
        ;;
    *)
        echo "mqtthub: unknown role '$role' (brokerd, console, worker, beat, migrate, spark-master, spark-worker, healthcheck, manage)" >&2
        exit 64
        ;;
esac
