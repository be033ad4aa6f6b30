"""Forms of the tenant pages. They check what a form can; the services
(``tenants.services``) have the last word and their errors are put back
onto these forms (``core.shortcuts.apply_service_error``)."""

import datetime as dt

from django import forms
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.utils import timezone

from . import limits
from .models import AclRule, Membership, Quota
from .validators import (
    SYS_PARTS,
    validate_device_name,
    validate_device_pattern,
    validate_fingerprint,
    validate_rule_topic,
)


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_current_timezone())
    return value


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self, attrs=None):
        super().__init__(attrs, format="%Y-%m-%dT%H:%M")


def _future(value):
    value = _aware(value)
    if value is not None and value <= timezone.now():
        raise ValidationError("Pick a moment in the future.")
    return value


class FingerprintField(forms.CharField):
    def to_python(self, value):
        value = super().to_python(value)
        return value.strip().replace(":", "").lower()


class DeviceImportForm(forms.Form):
    file = forms.FileField(label="CSV file", help_text="The first line names the columns: name, and optionally "
                           "cert_fingerprint, cert_cn, description. At most 100,000 devices.",
                           widget=forms.ClearableFileInput(attrs={"accept": ".csv,text/csv,text/plain"}))
    label = forms.CharField(max_length=100, required=False, label="Credential label",
                            help_text="Given to every device's credential (optional).")


class DeviceForm(forms.Form):
    name = forms.CharField(max_length=128, validators=[validate_device_name],
                           help_text="Lowercase letters, digits, '-', '_' and '.'. Devices sign in as "
                                     "TENANT/NAME; the name cannot be changed later.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    cert_fingerprint = FingerprintField(required=False, label="Certificate fingerprint",
                                        validators=[validate_fingerprint],
                                        help_text="Optional: SHA-256 of the device's client certificate "
                                                  "(hex, colons allowed), for TLS client authentication.")
    cert_cn = forms.CharField(required=False, max_length=255, label="Certificate common name")
    with_credential = forms.BooleanField(required=False, initial=True, label="Create a first credential",
                                         help_text="A password for TENANT/NAME, shown once on the next page.")
    label = forms.CharField(required=False, max_length=100, label="Credential label")
    expires_at = forms.DateTimeField(required=False, widget=DateTimeLocalInput, label="Credential expires",
                                     help_text="Optional, in UTC. Leave empty for a credential that never expires.")

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if editing:
            for name in ("name", "with_credential", "label", "expires_at"):
                del self.fields[name]

    def clean_name(self):
        name = self.cleaned_data["name"]
        if name == "new":
            raise ValidationError("'new' is reserved; choose another name.")
        if name in (".", ".."):
            # a browser resolves /devices/../ to the parent page: such a device could not be opened
            raise ValidationError(f"'{name}' cannot be a device name; choose another name.")
        return name

    def clean_expires_at(self):
        return _future(self.cleaned_data.get("expires_at"))


class CredentialForm(forms.Form):
    label = forms.CharField(required=False, max_length=100, help_text="e.g. factory, field-2025.")
    expires_at = forms.DateTimeField(required=False, widget=DateTimeLocalInput, label="Expires",
                                     help_text="Optional, in UTC.")

    def clean_expires_at(self):
        return _future(self.cleaned_data.get("expires_at"))


class ExpireForm(forms.Form):
    when = forms.ChoiceField(choices=[("now", "Now"), ("at", "At a date")], initial="now",
                             widget=forms.RadioSelect, label="Expire")
    at = forms.DateTimeField(required=False, widget=DateTimeLocalInput, label="Date and time (UTC)")

    def clean(self):
        data = super().clean()
        if data.get("when") == "at":
            if not data.get("at"):
                self.add_error("at", "Pick the date and time it expires.")
            else:
                data["at"] = _aware(data["at"])
        else:
            data["at"] = None
        return data


ALLOW_CHOICES = [("allow", "Allow"), ("deny", "Deny")]


class AclRuleForm(forms.Form):
    who = forms.ChoiceField(choices=[("all", "All devices"), ("device", "One device"),
                                     ("pattern", "Devices matching a pattern")], initial="all", label="Applies to")
    device = forms.ChoiceField(required=False, choices=[])
    pattern = forms.CharField(required=False, max_length=128, validators=[validate_device_pattern],
                              label="Device pattern", help_text="A glob such as sensor-* or gw-?.")
    action = forms.ChoiceField(choices=AclRule.Action.choices, initial="both")
    topic = forms.CharField(max_length=1024, validators=[validate_rule_topic], label="Topic filter",
                            help_text="Wildcards + and # allowed; {device} and {client_id} fill a whole level.")
    allow = forms.ChoiceField(choices=ALLOW_CHOICES, initial="allow", label="Decision")
    position = forms.IntegerField(required=False, min_value=1,
                                  help_text="1 is evaluated first. Empty: after the last rule.")

    def __init__(self, *args, tenant, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        names = list(tenant.devices.order_by("name").values_list("name", flat=True))
        self.fields["device"].choices = [("", "—"), *[(n, n) for n in names]]
        if editing:
            del self.fields["position"]

    def clean(self):
        data = super().clean()
        who = data.get("who")
        if who == "device" and not data.get("device"):
            self.add_error("device", "Choose the device this rule is for.")
        if who == "pattern" and not data.get("pattern"):
            self.add_error("pattern", "A pattern rule needs a device pattern.")
        return data

    def service_kwargs(self) -> dict:
        d = self.cleaned_data
        who = d["who"]
        return {"who": who, "device": d.get("device") if who == "device" else None,
                "pattern": d.get("pattern") if who == "pattern" else None, "action": d["action"],
                "topic": d["topic"], "allow": d["allow"] == "allow"}


class AclCheckForm(forms.Form):
    device = forms.CharField(max_length=128, validators=[validate_device_name],
                             widget=forms.TextInput(attrs={"list": "acl-devices"}))
    client_id = forms.CharField(required=False, max_length=256, label="Client id",
                                help_text="Defaults to the device name.")
    action = forms.ChoiceField(choices=[("publish", "publish to"), ("subscribe", "subscribe to")])
    topic = forms.CharField(max_length=1024)


def _limit_field(help_text: str):
    return forms.IntegerField(required=False, min_value=1, max_value=limits.MAX_LIMIT, help_text=help_text)


class QuotaForm(forms.Form):
    """One optional positive integer per quota field (empty: unlimited / the ceiling)."""

    def __init__(self, *args, ceiling=None, prefix=None, **kwargs):
        super().__init__(*args, prefix=prefix, **kwargs)
        self.ceiling = ceiling
        for name in limits.QUOTA_FIELDS:
            help_text = Quota._meta.get_field(name).help_text
            self.fields[name] = _limit_field(help_text)
            self.fields[name].label = name.replace("_", " ")
            self.fields[name].widget.attrs["placeholder"] = "unlimited" if ceiling is None else "ceiling"

    def clean(self):
        data = super().clean()
        if self.ceiling is not None:
            for name in limits.QUOTA_FIELDS:
                value, top = data.get(name), getattr(self.ceiling, name)
                if value is not None and top is not None and value > top:
                    self.add_error(name, f"May not exceed the ceiling of {top} the platform administrators set.")
        return data


class SystemTopicsForm(forms.Form):
    enabled = forms.BooleanField(required=False, label="Publish $SYS topics to this tenant's clients")
    interval = forms.IntegerField(min_value=1, max_value=86400, help_text="Seconds between publications.")
    parts = forms.MultipleChoiceField(required=False, choices=[(p, p) for p in SYS_PARTS],
                                      widget=forms.CheckboxSelectMultiple, label="Parts")


class MemberForm(forms.Form):
    # the user model's own rule: the service saves the user without full_clean
    username = forms.CharField(max_length=150, validators=[UnicodeUsernameValidator()],
                               help_text="Letters, digits and @ . + - _ only.")
    email = forms.EmailField(required=False)
    password = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                               label="Initial password", help_text="They can change it after signing in.")
    role = forms.ChoiceField(choices=Membership.Role.choices, initial="viewer")


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)


def _qos_choice(value):
    """A republish's QoS from the form: 0, 1, 2, or ``${qos}`` (the message's)."""
    return value if value == "${qos}" else int(value)


class RuleForm(forms.Form):
    """A rule of the rule engine and its action -- republish, webhook or store
    (``action``; a form without it is a republish one). Only the chosen
    action's fields are read; ``tenants.rules`` compiles the statement and
    validates the action (brokerd's own validator) and has the last word."""

    ACTIONS = [("republish", "Republish"), ("webhook", "Webhook"), ("store", "Store to a dataset")]
    METHODS = [(m, m) for m in ("POST", "PUT", "PATCH", "GET", "DELETE")]

    sql = forms.CharField(label="Statement", max_length=16_384, strip=False, widget=forms.Textarea(attrs={
        "rows": 6, "spellcheck": "false", "class": "mono", "autocomplete": "off",
        "placeholder": 'SELECT payload.temp AS t, clientid FROM "sensors/+/temp" WHERE t > 30'}),
        help_text='SELECT … FROM "topic/filter" (or "$events/client_connected" …) [WHERE …]')
    action = forms.ChoiceField(label="Action", choices=ACTIONS, required=False, initial="republish",
                               widget=forms.RadioSelect)
    # republish
    topic = forms.CharField(label="Republish to", max_length=1024, required=False, help_text="A topic template: "
                            "${field} from the output row, ${clientid}, ${topic}, ${username}.",
                            widget=forms.TextInput(attrs={"placeholder": "alerts/${clientid}", "class": "mono"}))
    qos = forms.TypedChoiceField(label="QoS", choices=[(0, "0"), (1, "1"), (2, "2"), ("${qos}", "As the message")],
                                 coerce=_qos_choice, initial=0,
                                 required=False, empty_value=0)
    retain = forms.BooleanField(label="Retain", required=False)
    retain_as_message = forms.BooleanField(label="Retain as the message was", required=False,
                                           help_text="Retained when the message (or event) that ran the rule "
                                                     "was retained: EMQX's ${flags.retain}.")
    payload = forms.CharField(label="Payload template", max_length=16_384, required=False,
                              help_text="Empty: the output row as JSON.",
                              widget=forms.TextInput(attrs={"placeholder": '{"t": ${t}}', "class": "mono"}))
    # webhook
    url = forms.CharField(label="URL", max_length=8192, required=False,
                          help_text="http:// or https://; ${field} templates in the path and query only.",
                          widget=forms.TextInput(attrs={"placeholder": "https://hooks.example.com/in/${clientid}",
                                                        "class": "mono"}))
    method = forms.ChoiceField(label="Method", choices=METHODS, initial="POST", required=False)
    headers = forms.CharField(label="Headers", max_length=16_384, required=False, strip=False,
                              help_text="One per line: Name: value (templates allowed).",
                              widget=forms.Textarea(attrs={"rows": 2, "class": "mono", "spellcheck": "false",
                                                           "placeholder": "Authorization: Bearer …"}))
    body = forms.CharField(label="Body template", max_length=16_384, required=False,
                           help_text="Empty: the output row as JSON.",
                           widget=forms.TextInput(attrs={"placeholder": '{"t": ${t}}', "class": "mono"}))
    timeout = forms.FloatField(label="Timeout (s)", required=False, initial=5.0, min_value=0.001, max_value=60)
    retries = forms.IntegerField(label="Retries", required=False, initial=3, min_value=0, max_value=10)
    # store
    dataset = forms.CharField(label="Dataset", max_length=32, required=False,
                              help_text="The tenant's telemetry dataset the rows are appended to (a-z, 0-9, _); "
                                        "read by the telemetry report.",
                              widget=forms.TextInput(attrs={"placeholder": "temperatures", "class": "mono"}))

    REQUIRED = {"republish": ("topic", "A topic template is required."),
                "webhook": ("url", "A URL is required."), "store": ("dataset", "A dataset name is required.")}

    def __init__(self, *args, default_action: str = "republish", **kwargs):
        """``default_action``: the kind a post without ``action`` means (an edited rule's own:
        a form that does not say never turns a webhook rule into a republish one)."""
        super().__init__(*args, **kwargs)
        self.default_action = default_action

    def clean(self):
        data = super().clean()
        data["action"] = data.get("action") or self.default_action
        name, message = self.REQUIRED[data["action"]]
        if not data.get(name):
            self.add_error(name, message)
        if data["action"] == "webhook":
            data["header_map"] = self._headers(data.get("headers") or "")
        return data

    def _headers(self, text: str) -> dict:
        out = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                self.add_error("headers", f"Expected 'Name: value', not {line.strip()[:60]!r}.")
                continue
            out[name.strip()] = value.strip()
        return out

    def action_config(self) -> dict:
        d = self.cleaned_data
        if d["action"] == "webhook":
            config = {"url": d["url"], "method": d.get("method") or "POST",
                      "timeout": d["timeout"] if d.get("timeout") is not None else 5.0,
                      "retries": d["retries"] if d.get("retries") is not None else 3}
            if d.get("header_map"):
                config["headers"] = d["header_map"]
            if d.get("body"):
                config["body"] = d["body"]
            return config
        if d["action"] == "store":
            return {"dataset": d["dataset"]}
        config = {"topic": d["topic"], "qos": d.get("qos") or 0,
                  "retain": "${flags.retain}" if d.get("retain_as_message") else d["retain"]}
        if d.get("payload"):
            config["payload"] = d["payload"]
        return config

    @staticmethod
    def initial_for(rule) -> dict:
        c = rule.config
        out = {"sql": rule.sql, "action": rule.action}
        if rule.action == "webhook":
            out.update(url=c.get("url", ""), method=c.get("method", "POST"), body=c.get("body", ""),
                       timeout=c.get("timeout", 5.0), retries=c.get("retries", 3),
                       headers="\n".join(f"{k}: {v}" for k, v in (c.get("headers") or {}).items()))
        elif rule.action == "store":
            out["dataset"] = c.get("dataset", "")
        else:
            retain = c.get("retain", False)
            out.update(topic=c.get("topic", ""), qos=c.get("qos", 0), retain=retain is True,
                       retain_as_message=retain == "${flags.retain}", payload=c.get("payload", ""))
        return out


class RuleTestForm(forms.Form):
    """A message to run a statement on, with no side effects."""

    sql = forms.CharField(max_length=16_384, strip=False)
    test_topic = forms.CharField(label="Topic", max_length=1024)
    test_payload = forms.CharField(label="Payload", max_length=65_536, required=False, strip=False)
    test_client_id = forms.CharField(label="Client id", max_length=256, required=False)
    # for a Topic of $events/...: the event's message topic (or subscription filter) and reason
    test_event_topic = forms.CharField(label="Event's topic", max_length=1024, required=False)
    test_reason = forms.CharField(label="Reason", max_length=64, required=False)
