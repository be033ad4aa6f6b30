"""What every report is (``Report``: a code, who may run it, how to run it) and
the header of its result -- shared by the usage reports (``reports``) and the
telemetry report (``telemetry``), which the registry in ``reports`` lists."""

from collections.abc import Callable
from datetime import UTC, datetime

from .jobs import Period

TOP_N = 10

Progress = Callable[[int, int, str], None]


def _noop(step: int, total: int, text: str) -> None:
    pass


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC).isoformat()


class Report:
    code = ""
    title = ""
    steps: list[str] = []

    def is_available_to(self, user, tenant=None) -> bool:
        raise NotImplementedError

    def run(self, spark, root: str, period: Period, tenant: str | None = None, top_n: int = TOP_N,
            progress: Progress = _noop, lake: str | None = None) -> dict:
        """``root`` is the landing zone (USAGE_DIR), ``lake`` the compacted
        lake (USAGE_LAKE; None: ``root/lake``): the report reads both (the
        usage reports: closed days from the lake's daily rollups where they
        are current, unless ``rollups=False``)."""
        raise NotImplementedError


def _header(kind: str, period: Period, tenant: str | None, top_n: int) -> dict:
    return {"kind": kind, "tenant": tenant, "start": _iso(period.start), "end": _iso(period.end),
            "generated_at": datetime.now(tz=UTC).isoformat(timespec="seconds"), "top_n": top_n}
