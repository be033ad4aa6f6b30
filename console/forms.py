"""Forms of the platform pages (login, tenants, tokens, live clients)."""


from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from core import audit
from tenants.models import Tenant
from tenants.validators import validate_email_list, validate_slug

from . import throttle
from .models import ApiToken


class LoginForm(AuthenticationForm):
    """Django's login form behind the throttle (``console.throttle``)."""

    def clean(self):
        username = (self.cleaned_data.get("username") or "").strip()
        addr = audit.remote_addr(self.request)
        if username:
            wait = throttle.seconds_locked(username, addr)
            if wait > 0:
                raise ValidationError(
                    f"Too many failed sign-in attempts. Try again in {throttle.wait_text(wait)}.",
                    code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            failed = username and any(e.code == "invalid_login" for e in exc.error_list)
            if failed and throttle.record_failure(username, addr):
                audit.record(self.request, "login.lockout", "user", username, actor=username,
                             after={"username": username, "remote_addr": addr, "limit": throttle.limit()})
            raise
        throttle.clear(username)
        return cleaned


def _emails(text: str) -> list[str]:
    return [e.strip() for e in text.replace(",", "\n").splitlines() if e.strip()]


class TenantForm(forms.Form):
    slug = forms.CharField(max_length=63, validators=[validate_slug],
                           help_text="Lowercase letters, digits and '-'. The first part of every MQTT "
                                     "username (TENANT/DEVICE); it cannot be changed later.")
    name = forms.CharField(max_length=200, required=False, help_text="Shown in the console; defaults to the slug.")
    contact_emails = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                     help_text="One address per line.")
    default_acl = forms.ChoiceField(choices=Tenant.DefaultAcl.choices, initial="deny",
                                    label="Default ACL decision",
                                    help_text="What applies when no ACL rule matches a publish or subscribe.")

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["slug"]

    def clean_slug(self):
        slug = self.cleaned_data["slug"]
        if slug == "new":
            raise ValidationError("'new' is reserved; choose another slug.")
        return slug

    def clean_contact_emails(self):
        emails = _emails(self.cleaned_data["contact_emails"])
        validate_email_list(emails)
        return emails


class TenantSearchForm(forms.Form):
    q = forms.CharField(required=False, label="Search")
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *Tenant.Status.choices])


class DeleteTenantForm(forms.Form):
    confirm = forms.CharField(label="Type the tenant's slug to confirm")

    def __init__(self, *args, slug: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.slug = slug

    def clean_confirm(self):
        value = self.cleaned_data["confirm"].strip()
        if value != self.slug:
            raise ValidationError(f"Type {self.slug} exactly to delete this tenant.")
        return value


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who or what uses it, e.g. grafana or deploy-script.")
    scope = forms.ChoiceField(choices=ApiToken.Scope.choices, initial="read", widget=forms.RadioSelect,
                              help_text="Read tokens may only GET; write tokens may also kick, "
                                        "subscribe, publish and delete.")


CONNECTED_CHOICES = [("", "Any"), ("true", "Connected"), ("false", "Offline")]


class ClientFilterForm(forms.Form):
    tenant = forms.CharField(required=False)
    client_id = forms.CharField(required=False, label="Client id")
    username = forms.CharField(required=False)
    ip = forms.CharField(required=False, label="IP address")
    node = forms.CharField(required=False)
    connected = forms.ChoiceField(required=False, choices=CONNECTED_CHOICES, label="Status")
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def __init__(self, *args, fixed_tenant: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fixed_tenant = fixed_tenant
        if fixed_tenant is not None:
            del self.fields["tenant"]

    def query(self) -> dict:
        d = self.cleaned_data if self.is_valid() else {}
        q = {k: (d.get(k) or None) for k in ("tenant", "client_id", "username", "ip", "node", "connected")}
        if self.fixed_tenant is not None:
            q["tenant"] = self.fixed_tenant
        q["page"] = d.get("page") or 1
        return q


class KickForm(forms.Form):
    clear_session = forms.BooleanField(required=False, label="Also clear its session",
                                       help_text="Subscriptions and queued messages are dropped; "
                                                 "otherwise a persistent session waits for the client.")


class SubscriptionForm(forms.Form):
    filter = forms.CharField(max_length=1024, label="Topic filter")
    qos = forms.TypedChoiceField(choices=[(0, "0"), (1, "1"), (2, "2")], coerce=int, initial=0, label="QoS")


class UnsubscribeForm(forms.Form):
    filter = forms.CharField(max_length=1024)


class PublishForm(forms.Form):
    topic = forms.CharField(max_length=1024, help_text="A topic name, no wildcards.")
    payload = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}),
                              help_text="Sent as UTF-8 text.")
    qos = forms.TypedChoiceField(choices=[(0, "0"), (1, "1"), (2, "2")], coerce=int, initial=0, label="QoS")
    retain = forms.BooleanField(required=False, help_text="Keep it as the topic's retained message.")

    def clean_topic(self):
        topic = self.cleaned_data["topic"]
        if "+" in topic or "#" in topic:
            raise ValidationError("A topic name cannot hold the wildcards + or #.")
        if topic.startswith("$"):
            raise ValidationError("Topics starting with $ are reserved for the broker.")
        return topic


class RetainedFilterForm(forms.Form):
    prefix = forms.CharField(required=False, label="Topic prefix")
    sys = forms.BooleanField(required=False, label="The broker's $SYS messages too")
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)
