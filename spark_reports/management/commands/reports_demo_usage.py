"""Write a made-up usage log for trying the reports before brokerd has logged
much: ``manage.py reports_demo_usage acme globex --days 7``.

Files go into USAGE_DIR (a local directory) under the node name "demo", so
they never replace a file brokerd wrote.
"""

import random
import time

from django.core.management.base import BaseCommand, CommandError

from spark_reports import usagegen
from spark_reports.spark import usage_dir


class Command(BaseCommand):
    help = "Write a made-up usage log (node 'demo') for the given tenants into USAGE_DIR."

    def add_arguments(self, parser):
        parser.add_argument("tenants", nargs="+")
        parser.add_argument("--days", type=int, default=7)
        parser.add_argument("--connections", type=int, default=3000)
        parser.add_argument("--traffic", type=int, default=5000)
        parser.add_argument("--seed", type=int, default=None)

    def handle(self, *args, tenants, days, connections, traffic, seed, **options):
        root = usage_dir()
        if "://" in root:
            raise CommandError(f"USAGE_DIR is {root}: demo data goes to a local directory only")
        rng = random.Random(seed)
        end = time.time()
        start = end - days * 86400
        conns = usagegen.random_connections(rng, connections, start, end, tenants, ["demo"], 40)
        rows = usagegen.random_traffic(rng, traffic, start, end, tenants, ["demo"], 25)
        files = usagegen.write_rows(root, "connections", conns) + usagegen.write_rows(root, "traffic", rows)
        self.stdout.write(f"wrote {len(conns):,} connections and {len(rows):,} traffic rows "
                          f"({files:,} files) for {', '.join(tenants)} into {root}")
