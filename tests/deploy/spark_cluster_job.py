"""Run by tests/deploy/test_spark_cluster.py in its own process (a process has one SparkSession, and the
test's may be a local one): compact a usage log into the lake and run the tenant and platform reports on
the Spark master named by SPARK_MASTER. Prints one JSON object: the reports' totals and who ran them."""

import json
import sys
from datetime import date

from spark_reports import lake, reports
from spark_reports.jobs import Period
from spark_reports.spark import get_spark

PERIOD = Period.days(date(2026, 3, 2), date(2026, 3, 4))


def main(root: str) -> None:
    spark = get_spark()
    sc = spark.sparkContext
    compacted = lake.compact(spark, root, now=PERIOD.start + 1.5 * 86400, settle=0, keep_landed=0)
    out = {"master": sc.master, "compacted_rows": compacted.rows, "totals": {}}
    for code, tenant in (("tenant", "acme"), ("platform", None)):
        out["totals"][code] = reports.get(code).run(spark, root, PERIOD, tenant)["totals"]
    # executors that ran tasks: the driver is one entry of the map, each remote executor another
    out["executors"] = sc._jsc.sc().getExecutorMemoryStatus().size()
    sys.stdout.write(json.dumps(out, default=str) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
