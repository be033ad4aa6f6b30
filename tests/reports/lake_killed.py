"""A compaction run that stops at a named point and waits to be killed
(tests/reports/test_lake.py): ``python -m tests.reports.lake_killed POINT LANDING``.
Prints ``paused at POINT`` when it gets there, then sleeps."""

import sys
import time

from spark_reports import lake


def main() -> None:
    point, landing = sys.argv[1], sys.argv[2]

    def pause(name: str) -> None:
        if name == point:
            print(f"paused at {name}", flush=True)
            time.sleep(600)

    lake._checkpoint = pause
    lake.main([landing, "--settle", "0", "--keep-landed", "0"])


if __name__ == "__main__":
    main()
