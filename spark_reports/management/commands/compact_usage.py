"""Compact the landed usage log into the lake now, once (what beat's
``compact_usage`` task does every LAKE_COMPACT_INTERVAL seconds):
``manage.py compact_usage``. Prints the run as JSON."""

import json

from django.core.management.base import BaseCommand, CommandError

from spark_reports.lake import CompactionBusy
from spark_reports.tasks import run_compaction


class Command(BaseCommand):
    help = "Compact the landed usage log (USAGE_DIR) into the Parquet lake (USAGE_LAKE), one run."

    def handle(self, *args, **options):
        try:
            r = run_compaction()
        except CompactionBusy as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(r))
