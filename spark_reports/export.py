"""A report's result as CSV: the whole report in one tidy file (``section,
item, metric, value`` -- what the email attaches and "Download CSV" gives),
or one table of it as a plain CSV.

Names in a report are the tenant's devices' doing (topics, client ids, user
names, telemetry fields): a text cell a spreadsheet would read as a formula
(starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return, e.g. a
topic ``=HYPERLINK(...)`` or ``=cmd|' /C calc'!A0``) is written with a ``'``
before it, so Excel, LibreOffice and Google Sheets show it as text (OWASP's
advice on CSV injection). Numbers are written as they are."""

import csv
import io
import zipfile

# table -> (key column, value columns) in the order they are written
TABLES = {
    "daily": ("date", ["msgs_in", "msgs_out", "bytes_in", "bytes_out", "connects", "disconnects", "rejected",
                       "dropped"]),
    "top_topics": ("topic", ["messages", "msgs_in", "msgs_out", "bytes", "bytes_in", "bytes_out"]),
    "top_devices": ("device", ["messages", "msgs_in", "msgs_out", "bytes", "bytes_in", "bytes_out", "connections",
                               "connected_seconds"]),
    "rejections": ("kind", ["count"]),
    "reasons": ("reason", ["count"]),
    "tenants": ("tenant", ["rank", "messages", "msgs_in", "msgs_out", "bytes_in", "bytes_out", "connects",
                           "devices", "peak_connections", "rejected", "dropped"]),
    "nodes": ("node", ["messages", "msgs_in", "msgs_out", "bytes_in", "bytes_out", "connects", "disconnects",
                       "peak_connections"]),
    # the telemetry report (spark_reports.telemetry); a key of several columns is written joined with "/"
    "datasets": ("dataset", ["rows", "devices", "rules", "first", "last"]),
    "fields": (("dataset", "field"), ["rows", "numeric", "min", "avg", "max"]),
    "series": (("dataset", "field", "at"), ["rows", "min", "avg", "max"]),
}

TOTALS = ["messages", "msgs_in", "msgs_in_q0", "msgs_in_q1", "msgs_in_q2", "msgs_out", "bytes_in", "bytes_out",
          "connects", "disconnects", "devices", "peak_connections", "peak_at", "median_session", "tenants",
          "rejected", "dropped", "acl_denied", "quota_rejected", "auth_failures", "dropped_queue_full",
          "dropped_expired", "dropped_no_subscribers"]


def tables_of(result: dict) -> list[str]:
    return [name for name in TABLES if name in result]


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _text(value: str) -> str:
    """A name as a spreadsheet shows it: never run as a formula."""
    return "'" + value if value.startswith(FORMULA_START) else value


def _cell(value):
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    if isinstance(value, str):
        return _text(value)
    return "" if value is None else value


def report_csv(result: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["section", "item", "metric", "value"])
    w.writerow(["report", _text(result.get("tenant") or "platform"), "kind", result["kind"]])
    w.writerow(["report", "", "start", result["start"]])
    w.writerow(["report", "", "end", result["end"]])
    totals = result.get("totals", {})
    for metric in TOTALS:
        if metric in totals:
            w.writerow(["totals", "", metric, _cell(totals[metric])])
    for table in tables_of(result):
        key, metrics = TABLES[table]
        for row in result[table]:
            for metric in metrics:
                if metric in row:
                    w.writerow([table, _key(row, key), metric, _cell(row[metric])])
    return out.getvalue()


def _key(row: dict, key) -> str:
    return _text("/".join(str(row.get(k, "")) for k in key) if isinstance(key, tuple) else str(row[key]))


def table_csv(result: dict, table: str) -> str:
    key, metrics = TABLES[table]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    keys = list(key) if isinstance(key, tuple) else [key]
    w.writerow([*keys, *metrics])
    for row in result.get(table, []):
        w.writerow([*[_cell(row.get(k)) for k in keys], *[_cell(row.get(m)) for m in metrics]])
    return out.getvalue()


def totals_csv(result: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["metric", "value"])
    w.writerow(["report", _text(result.get("tenant") or "platform")])
    w.writerow(["start", result["start"]])
    w.writerow(["end", result["end"]])
    totals = result.get("totals", {})
    for metric in TOTALS:
        if metric in totals:
            w.writerow([metric, _cell(totals[metric])])
    return out.getvalue()


def report_zip(result: dict, base: str) -> bytes:
    """For spreadsheets: one CSV per section (``totals.csv``, ``daily.csv``, ...), a column per metric."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{base}/totals.csv", totals_csv(result))
        for table in tables_of(result):
            z.writestr(f"{base}/{table}.csv", table_csv(result, table))
    return out.getvalue()


def basename(run) -> str:
    who = run.tenant.slug if run.tenant_id else "platform"
    what = "telemetry" if run.kind == "telemetry" else "usage"
    return f"{what}-{who}-{run.period_start:%Y-%m-%d}-to-{run.last_day:%Y-%m-%d}"


def filename(run, table: str | None = None) -> str:
    base = basename(run)
    return f"{base}-{table}.csv" if table else f"{base}.csv"
