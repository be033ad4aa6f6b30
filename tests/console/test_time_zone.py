"""The console shows every time in UTC, as its pages and emails say, whatever the server's
environment: a TIME_ZONE of America/Los_Angeles showed a daily report of 2026-03-02 (UTC) as of
2026-03-01, "UTC" beside it, and schedule times eight hours off."""

import os
import subprocess
import sys

from ..procs import ROOT


def test_the_console_renders_report_dates_in_utc_whatever_time_zone_the_environment_names():
    code = (
        "import datetime, django; django.setup()\n"
        "from django.template import Context, Template\n"
        "at = datetime.datetime(2026, 3, 2, 0, 30, tzinfo=datetime.UTC)\n"
        "print(Template('{{ at|date:\"Y-m-d H:i\" }}').render(Context({'at': at})))\n"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="console.settings", TIME_ZONE="America/Los_Angeles")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2026-03-02 00:30"
