"""A Celery worker killed in the middle of a report (a deploy, the OOM killer, a host restart):
the run is not left "running" for ever -- it is queued again and finished by a worker."""

import signal
import time

import pytest
from django.urls import reverse

from . import test_celery as celery_tests
from .test_celery import Proc, wait_for, wait_for_run

# test_celery's fixtures: its migrated database file, usage log and users, made again for this module
plane, shared_db, people = celery_tests.plane, celery_tests.shared_db, celery_tests.people

pytestmark = pytest.mark.slow

WORKER = ["worker", "-P", "threads", "-c", "2", "--without-mingle", "--without-gossip", "-l", "info"]


def test_a_run_whose_worker_was_killed_is_run_again(people, plane, settings):
    """Celery takes a task off the queue when a worker starts it: killed, the run stayed "running"
    (the page polled "Step 0 of 5" for ever) and a scheduled one was never emailed."""
    from spark_reports import tasks
    from spark_reports.models import ReportRun

    acme, client = people
    first = Proc(WORKER, plane.env, ready="ready.")
    try:
        response = client.post(reverse("reports", args=["acme"]), {"preset": "last_7"})
        run_id = int(response["Location"].rstrip("/").rsplit("/", 1)[1])
        # killed while its Spark session starts (seconds): the run was taken, nothing is finished
        wait_for(lambda: ReportRun.objects.get(pk=run_id).status == "running", 60, first.log)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
    finally:
        first.stop()
    run = ReportRun.objects.get(pk=run_id)
    assert run.status == "running"
    # beat's dispatch, once the run has gone without a heartbeat for REPORTS_STALLED_AFTER
    settings.REPORTS_STALLED_AFTER = 1
    time.sleep(1.5)
    tasks.dispatch_due_schedules()
    page = client.get(reverse("report", args=["acme", run_id])).content.decode()
    second = Proc(WORKER, plane.env, ready="ready.")
    try:
        wait_for_run(run_id, second, 150)
    finally:
        second.stop()
    run.refresh_from_db()
    assert run.status == "succeeded" and run.error == "" and run.attempts == 2
    assert "The worker running it stopped" in page       # what the page said meanwhile
