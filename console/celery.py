"""The Celery application of the console: usage reports (``spark_reports.tasks``).

    celery -A console worker -P threads -c 2     # one Spark JVM per worker process
    celery -A console beat                       # schedules from the database

Configuration comes from Django's settings (``CELERY_*``, see settings.py):
Redis when REDIS_URL is set, else kombu's filesystem transport under
var/celery, which needs no server.
"""

import os
import uuid
from pathlib import Path
from time import monotonic

from celery import Celery
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")



def _put_whole(self, queue, payload, **kwargs):
    """kombu's filesystem transport (``Channel._put``) creates a message's file, then
    writes it: a worker listing the folder in between moves the file away, reads it
    empty, and its consumer dies ("Unrecoverable error: JSONDecodeError"; seen in the
    test suite with beat sending every second). Here the message is written under a
    name no worker takes (``….msg.tmp``) and renamed into place: a worker finds the
    whole message or none."""
    name = os.path.join(self.data_folder_out, f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg")
    try:
        with open(name + ".tmp", "wb") as f:
            f.write(str_to_bytes(filesystem.dumps(payload)))
        os.replace(name + ".tmp", name)
    except OSError as exc:
        raise ChannelError(f"Cannot add file {name!r} to directory") from exc


filesystem.Channel._put = _put_whole

app = Celery("mqtthub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _filesystem_folders(sender, **kwargs):
    # the filesystem transport expects its folders to exist
    for key in ("data_folder_in", "data_folder_out", "control_folder"):
        folder = (sender.conf.broker_transport_options or {}).get(key)
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
