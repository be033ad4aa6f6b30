"""The Celery application of the console: usage reports (``spark_reports.tasks``).

    celery -A console worker -P threads -c 2     # one Spark JVM per worker process
    celery -A console beat                       # schedules from the database

Configuration comes from Django's settings (``CELERY_*``, see settings.py):
Redis when REDIS_URL is set, else kombu's filesystem transport under
var/celery, which needs no server.
"""

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

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
