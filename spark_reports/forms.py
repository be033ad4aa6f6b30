"""Forms of the report pages: a period to run a report over, and a schedule."""

from datetime import UTC, date, datetime, timedelta

from django import forms
from django.conf import settings

from .models import ReportSchedule

MAX_DAYS = 366

PRESETS = [
    ("last_7", "Last 7 days"),
    ("last_30", "Last 30 days"),
    ("this_month", "This month so far"),
    ("last_month", "Last month"),
    ("today", "Today so far"),
    ("custom", "Custom dates"),
]


def today_utc() -> date:
    return datetime.now(tz=UTC).date()


def preset_period(preset: str, today: date) -> tuple[date, date]:
    if preset == "today":
        return today, today
    if preset == "last_7":
        return today - timedelta(days=6), today
    if preset == "last_30":
        return today - timedelta(days=29), today
    if preset == "this_month":
        return today.replace(day=1), today
    if preset == "last_month":
        last = today.replace(day=1) - timedelta(days=1)
        return last.replace(day=1), last
    raise ValueError(preset)


class RunReportForm(forms.Form):
    """A period; on a tenant's page also which report (``tenant=True``): its usage or its telemetry."""

    KINDS = [("tenant", "Usage"), ("telemetry", "Telemetry (what its store rules kept)")]

    kind = forms.ChoiceField(label="Report", choices=KINDS, initial="tenant", required=False,
                             widget=forms.RadioSelect)
    preset = forms.ChoiceField(label="Period", choices=PRESETS, initial="last_7")
    first = forms.DateField(label="From (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"}))
    last = forms.DateField(label="To, included", required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, tenant: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if not tenant:
            del self.fields["kind"]

    def clean(self):
        data = super().clean()
        if "kind" in self.fields:
            data["kind"] = data.get("kind") or "tenant"
        preset = data.get("preset")
        if not preset:
            return data
        today = today_utc()
        if preset == "custom":
            first, last = data.get("first"), data.get("last")
            if not first or not last:
                raise forms.ValidationError("Give both dates of a custom period.")
        else:
            first, last = preset_period(preset, today)
        if first > last:
            raise forms.ValidationError("The period ends before it starts.")
        if (last - first).days + 1 > MAX_DAYS:
            raise forms.ValidationError(f"A report covers at most {MAX_DAYS} days.")
        data["first"], data["last"] = first, last
        return data


HOURS = [(h, f"{h:02d}:00 UTC") for h in range(24)]


class ScheduleForm(forms.ModelForm):
    hour = forms.TypedChoiceField(label="Time of day", choices=HOURS, coerce=int, initial=6)
    recipients = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple,
                                           help_text="The tenant's contact emails (edit them on the tenant).")

    class Meta:
        model = ReportSchedule
        fields = ["frequency", "hour", "recipients", "enabled"]
        widgets = {"frequency": forms.RadioSelect}
        help_texts = {"frequency": "Daily: the day before. Weekly (Mondays): the week before. "
                                   "Monthly (on the 1st): the month before."}

    def __init__(self, *args, tenant, **kwargs):
        super().__init__(*args, **kwargs)
        contacts = list(tenant.contact_emails or [])
        self.fields["recipients"].choices = [(e, e) for e in contacts]
        if not self.instance.pk and not self.is_bound:
            self.initial["recipients"] = contacts
        self.fields["frequency"].choices = ReportSchedule.Frequency.choices
        self.no_contacts = not contacts
        self.tenant = tenant

    def clean(self):
        data = super().clean()
        limit = settings.REPORTS_MAX_SCHEDULES
        if not self.instance.pk and self.tenant.report_schedules.count() >= limit:
            raise forms.ValidationError(f"This tenant has {limit} report schedules, the most it may have. "
                                        "Change or delete one of them instead.")
        return data
