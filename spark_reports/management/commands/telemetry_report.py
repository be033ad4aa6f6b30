"""``manage.py telemetry_report TENANT [--dataset NAME] [--from DAY] [--to DAY]``:
the telemetry report (``spark_reports.telemetry``) of one tenant over whole UTC
days, run now on this process's Spark session; prints the result as JSON."""

import json
from datetime import date

from django.core.management.base import BaseCommand, CommandError

from brokerd.rules.actions import DATASET as DATASET_RE
from spark_reports.forms import MAX_DAYS, today_utc
from spark_reports.jobs import Period, UsageLogError
from spark_reports.spark import get_spark, lake_dir, usage_dir
from spark_reports.telemetry import TelemetryReport
from tenants.models import Tenant


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise CommandError(f"not a date (YYYY-MM-DD): {text!r}") from None


class Command(BaseCommand):
    help = ("What a tenant's store rules kept (manage.py rules add TENANT --sql SQL --store DATASET): rows, fields "
            "and min/avg/max of numeric fields per dataset and per hour, over whole UTC days (default today).")

    def add_arguments(self, parser):
        parser.add_argument("tenant")
        parser.add_argument("--dataset", help="one dataset only (default: all of the tenant's)")
        parser.add_argument("--from", dest="first", metavar="YYYY-MM-DD", help="first day (UTC; default today)")
        parser.add_argument("--to", dest="last", metavar="YYYY-MM-DD", help="last day, included (default: --from)")

    def handle(self, tenant, dataset=None, first=None, last=None, **_):
        if not Tenant.objects.filter(slug=tenant).exists():
            raise CommandError(f"no tenant {tenant!r}")
        if dataset is not None and not DATASET_RE.fullmatch(dataset):
            raise CommandError(f"not a dataset name: {dataset!r}")
        first_day = _day(first) if first else today_utc()
        last_day = _day(last) if last else first_day
        if last_day < first_day:
            raise CommandError("the period ends before it starts")
        if (last_day - first_day).days + 1 > MAX_DAYS:
            raise CommandError(f"a report covers at most {MAX_DAYS} days")
        try:
            result = TelemetryReport().run(get_spark(), usage_dir(), Period.days(first_day, last_day), tenant,
                                           lake=lake_dir(), dataset=dataset)
        except UsageLogError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(result))
