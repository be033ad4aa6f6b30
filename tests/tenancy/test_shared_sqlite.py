"""The embedded control plane is one SQLite file written by several processes:
the console (and Celery) through Django, and every brokerd node with plain SQL
(its audit events and metrics history) while it polls the policies. An
administrator creating devices while a node writes must not see "database is
locked" (CI saw it: a device created while brokerd wrote its history)."""

import datetime
import threading
import time

from brokerd.tenancy.source import PolicyDatabase


def test_devices_are_created_while_brokerd_writes_and_polls_the_same_sqlite_file(control_plane):
    db = PolicyDatabase(control_plane.url)
    stop = threading.Event()
    errors: list[str] = []
    written = [0]

    def brokerd_writes():                  # audit events, as a node records kicks and bans (50 to a transaction)
        while not stop.is_set():
            at = datetime.datetime.now(datetime.UTC).timestamp()
            try:
                for i in range(50):
                    db.insert_audit({"at": at, "actor": "brokerd", "source": "brokerd", "action": "client.kick",
                                     "object_type": "client", "object_id": f"c{i}", "tenant": "acme"})
                written[0] += 50
            except Exception as exc:
                errors.append(f"write: {exc}")

    def brokerd_polls():                   # the node's policy poll, read-only
        while not stop.is_set():
            try:
                db.fetch(0)
            except Exception as exc:
                errors.append(f"poll: {exc}")
            time.sleep(0.01)

    threads = [threading.Thread(target=brokerd_writes), threading.Thread(target=brokerd_polls)]
    for t in threads:
        t.start()
    try:
        secrets = control_plane.provision([{"slug": "acme", "devices": [f"pump-{i}" for i in range(120)]}])
        secret = control_plane.device("acme", "pump-last")          # `manage.py devices create`, as CI ran it
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(secrets) == 120 and secret
    assert errors == []
    assert written[0] > 0
    assert control_plane.query("SELECT COUNT(*) FROM tenants_device")[0][0] == 121
    assert control_plane.query("SELECT COUNT(*) FROM console_auditevent WHERE source = 'brokerd'")[0][0] == written[0]
    assert control_plane.query("PRAGMA journal_mode")[0][0] == "wal"
