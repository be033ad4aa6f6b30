"""A Celery worker killed in the middle of a report (a deploy, the OOM killer, a host restart):
the run is not left "running" for ever -- it is queued again and finished by a worker."""

import signal
import time

import pytest
from django.urls import reverse

from . import test_celery as celery_tests
from .test_celery import Proc, wait_for, wait_for_run

# test_celery's fixtures: its migrated database file and users, made again for this module
shared_db, people = celery_tests.shared_db, celery_tests.people


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """test_celery's plane with a quarter of its usage log: these tests check where a run goes, not
    its figures (each report a worker ran here read ~4,000 files)."""
    return celery_tests.make_plane(tmp_path_factory, connections=150, traffic_rows=250)

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


def test_a_run_queued_behind_another_when_the_worker_was_killed_is_run_too(people, plane, settings):
    """A worker fetches messages ahead of running them (the filesystem broker deletes a fetched one; Redis
    gives it back only after an hour): killed, the run waiting behind the one it was running stayed
    "queued" for ever -- the page said "Waiting for a worker" and no worker ever took it."""
    from spark_reports import tasks
    from spark_reports.models import ReportRun

    acme, client = people
    queue = plane.dir / "celery" / "queue"
    first = Proc([*WORKER[:4], "1", *WORKER[5:]], plane.env, ready="ready.")      # one thread: one at a time
    try:
        ids = []
        for preset in ("last_7", "last_30"):
            response = client.post(reverse("reports", args=["acme"]), {"preset": preset})
            ids.append(int(response["Location"].rstrip("/").rsplit("/", 1)[1]))
        # the first one running, the second fetched by the worker (no message left in the queue)
        wait_for(lambda: ReportRun.objects.get(pk=ids[0]).status == "running" and not list(queue.glob("*.msg")),
                 60, first.log)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
    finally:
        first.stop()
    assert [ReportRun.objects.get(pk=pk).status for pk in ids] == ["running", "queued"]
    settings.REPORTS_STALLED_AFTER = 1
    time.sleep(1.5)
    tasks.dispatch_due_schedules()           # beat's dispatch
    tasks.dispatch_due_schedules()           # and its next tick: nothing queued twice
    assert len(list(queue.glob("*.msg"))) == 2
    second = Proc(WORKER, plane.env, ready="ready.")
    try:
        for pk in ids:
            wait_for_run(pk, second, 150)
    finally:
        second.stop()
    runs = [ReportRun.objects.get(pk=pk) for pk in ids]
    assert [(r.status, r.attempts) for r in runs] == [("succeeded", 2), ("succeeded", 1)]
