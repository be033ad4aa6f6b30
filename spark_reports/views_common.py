"""What a report page, its printable version and its email show of a result:
key figures, tables and charts, prepared once from ``ReportRun.result``."""

from core.templatetags.core_tags import plural

from . import charts, jobs


def _num(v) -> str:
    return f"{int(v or 0):,}"


def report_context(run) -> dict:
    r = run.result or {}
    if r.get("kind") == "telemetry":
        return telemetry_context(r)
    t = r.get("totals", {})
    labels, series = charts.daily_series(r)
    churn_labels, churn = charts.churn_series(r)
    figures = [
        {"label": "Messages", "value": _num(t.get("messages")),
         "sub": f"{_num(t.get('msgs_in'))} in · {_num(t.get('msgs_out'))} out"},
        {"label": "Bytes", "bytes": (t.get("bytes_in") or 0) + (t.get("bytes_out") or 0),
         "sub_bytes": (t.get("bytes_in") or 0, t.get("bytes_out") or 0)},
        {"label": "Connections", "value": _num(t.get("connects")),
         "sub": f"{plural(t.get('disconnects'), 'disconnect')} · {plural(t.get('devices'), 'device')}"},
        {"label": "Peak concurrent", "value": _num(t.get("peak_connections")),
         "sub": (f"at {t['peak_at'][:19].replace('T', ' ')} UTC" if t.get("peak_at") else "no connections")},
        {"label": "Median session", "seconds": t.get("median_session"),
         "sub": f"of {plural(t.get('disconnects'), 'session')} closed"},
        {"label": "Rejected", "value": _num(t.get("rejected")),
         "sub": f"{_num(t.get('dropped'))} dropped"},
    ]
    if r.get("kind") == "platform":
        figures.insert(0, {"label": "Tenants", "value": _num(t.get("tenants")), "sub": "with usage"})
    rejection_labels = dict(jobs.REJECTION_KINDS)
    # a quiet period gets a sentence, not an empty chart box (as in the email)
    quiet = not any(v for _, values in series for v in values)
    still = not any(v for _, values in churn for v in values)
    return {
        "r": r,
        "generated": (r.get("generated_at") or "")[:19].replace("T", " "),
        "t": t,
        "figures": figures,
        "traffic_chart": charts.bar_chart(labels, series, title="Messages per day") if labels and not quiet else "",
        "churn_chart": charts.bar_chart(churn_labels, churn, title="Connects and disconnects per day",
                                        stacked=False) if churn_labels and not still else "",
        "traffic_empty": "No message was sent or received in this period." if labels else "No days.",
        "churn_empty": "No device connected or disconnected in this period." if churn_labels else "No days.",
        "rejection_rows": [{**row, "label": row.get("label") or rejection_labels.get(row["kind"], row["kind"])}
                           for row in r.get("rejections", [])],
    }


def telemetry_context(r: dict) -> dict:
    datasets = r.get("datasets", [])
    numeric = sum(1 for f in r.get("fields", []) if f.get("numeric"))
    figures = [
        {"label": "Rows", "value": _num(sum(d["rows"] for d in datasets)),
         "sub": plural(len(datasets), "dataset")},
        {"label": "Devices", "value": _num(max((d["devices"] for d in datasets), default=0)),
         "sub": "in the busiest dataset"},
        {"label": "Fields", "value": _num(len(r.get("fields", []))), "sub": f"{_num(numeric)} with numbers"},
    ]
    return {"r": r, "generated": (r.get("generated_at") or "")[:19].replace("T", " "), "t": {}, "figures": figures}
