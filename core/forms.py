"""The audit log's filter, shared by the platform's log and a tenant's."""

import datetime as dt

from django import forms
from django.utils import timezone


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False)
    action = forms.CharField(required=False, help_text="e.g. device. or credential.rotate")
    tenant = forms.CharField(required=False)
    object_type = forms.CharField(required=False, label="Object type")
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def filter(self, qs):
        d = self.cleaned_data
        if d.get("actor"):
            qs = qs.filter(actor__icontains=d["actor"])
        if d.get("action"):
            qs = qs.filter(action__istartswith=d["action"])
        if d.get("tenant") and "tenant" in self.fields:
            qs = qs.filter(tenant=d["tenant"])
        if d.get("object_type"):
            qs = qs.filter(object_type__iexact=d["object_type"])
        tz = timezone.get_current_timezone()
        if d.get("since"):
            qs = qs.filter(at__gte=dt.datetime.combine(d["since"], dt.time.min, tz))
        if d.get("until"):
            qs = qs.filter(at__lt=dt.datetime.combine(d["until"] + dt.timedelta(days=1), dt.time.min, tz))
        return qs
