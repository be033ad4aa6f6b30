"""``{% alarm_panel %}``: the open alarms (and the recently cleared ones) as a
card, for the overview, the dashboards and the tenant's pages."""

from django import template

from metrics.core import NODE_DOWN
from metrics.models import Alarm

register = template.Library()

RECENT = 8


@register.inclusion_tag("metrics/partials/alarms.html", takes_context=True)
def alarm_panel(context, tenant: str | None = None, node: str | None = None, title: str = "Alarms"):
    qs = Alarm.objects.all()
    if tenant:
        qs = qs.filter(tenant_slug=tenant)
    if node:
        qs = qs.filter(kind=NODE_DOWN, subject=node)
    return {
        "open_alarms": list(qs.filter(cleared_at__isnull=True).order_by("raised_at", "id")),
        "recent_alarms": list(qs.filter(cleared_at__isnull=False).order_by("-cleared_at", "-id")[:RECENT]),
        "title": title, "tenant": tenant, "node": node,
        "is_platform_admin": context.get("is_platform_admin"),
        "request": context.get("request"),
    }
