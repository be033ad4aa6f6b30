"""Celery's broker on embedded defaults is kombu's filesystem transport: one file per
message in a folder that the worker lists and takes from. A message must appear there
whole: kombu creates the file and then writes it, and a worker that took the file in
between read it empty and its consumer died ("Unrecoverable error: JSONDecodeError"),
so queued reports waited for a worker that was gone."""

import kombu.transport.filesystem as filesystem
from kombu import Connection

import console.celery  # noqa: F401  (the console's Celery application: how it writes messages)


def test_a_worker_taking_messages_while_one_is_written_never_finds_it_half_written(tmp_path, monkeypatch):
    opts = {"data_folder_in": str(tmp_path / "q"), "data_folder_out": str(tmp_path / "q"),
            "control_folder": str(tmp_path / "control")}
    (tmp_path / "q").mkdir()
    seen = []
    with Connection("filesystem://", transport_options=opts) as beat, \
            Connection("filesystem://", transport_options=opts) as worker:
        taking = worker.default_channel
        real_dumps = filesystem.dumps

        def dumps_while_the_worker_looks(payload):
            # the moment between the message's file being made and its bytes written:
            # the worker lists the folder and takes what it finds
            try:
                seen.append(taking._get("reports"))
            except filesystem.Empty:
                seen.append(None)
            return real_dumps(payload)

        monkeypatch.setattr(filesystem, "dumps", dumps_while_the_worker_looks)
        sending = beat.default_channel
        sending._put("reports", {"body": "report 1"})
        sending._put("reports", {"body": "report 2"})
        monkeypatch.setattr(filesystem, "dumps", real_dumps)
        assert seen[0] is None
        assert seen[1] == {"body": "report 1"}                 # the first, whole; the second not yet
        assert taking._get("reports") == {"body": "report 2"}
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "q").iterdir())
