"""The tenant's Rules page: its rules of the rule engine (``tenants.rules``)
with each rule's counters from the nodes, the editor, and a runner that
shows what a statement outputs for one message without any side effect.

Who may do what is the ACL page's model (``tenants.access``): platform
administrators and the tenant's administrators change rules, its viewers
read them, anyone else gets a 404. The statement is compiled by the
service, whose ``RuleStatementError`` carries the line and column shown
under the editor. The service writes the audit rows. The counters come from
brokerd's admin API (``GET /api/v1/tenants/{t}/rules``, summed over the
nodes); when no node answers the page says so and shows no figures.
"""

import datetime as dt

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from core.shortcuts import Live, render_page, wants_fragment

from . import rules as rule_service
from .access import get_processing_rule_for_user, get_tenant_for_user
from .errors import ServiceError
from .forms import RuleForm, RuleTestForm

PAGE, EDITOR, TABLE = "tenants/rules.html", "tenants/partials/rules_editor.html", "tenants/partials/rules_table.html"


def _when(seconds) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(seconds, dt.UTC) if seconds else None


def _rows(request, tenant) -> dict:
    """The tenant's rules, each with its counters from the nodes (None when no node answered)."""
    live = Live(request)
    answer = live.call("rules", tenant.slug)
    counters = {item["id"]: dict(item, last_error_at=_when(item.get("last_error_at")))
                for item in answer["items"]} if answer else {}
    rows = [{"rule": r, "stats": counters.get(r.pk)} for r in rule_service.rules(tenant)]
    return {"rows": rows, "nodes_answered": answer is not None,
            "nodes_error": live.unavailable or (live.error.message if live.error else None), **live.context()}


def _context(request, tenant, rw, form=None, editing=None, test_form=None, test=None) -> dict:
    if form is None and rw:
        form = RuleForm(initial=RuleForm.initial_for(editing) if editing else None)
    return {"tenant": tenant, "rw": rw, "form": form, "editing": editing, "test_form": test_form, "test": test,
            "statement_error": getattr(form, "statement_error", None), **_rows(request, tenant)}


def _editor(request, context):
    return render_page(request, PAGE, EDITOR, context)


def _save(request, form, save) -> bool:
    """Run ``save(form)``; a refused statement or action goes back onto the form."""
    if not form.is_valid():
        return False
    try:
        save(form)
    except rule_service.RuleStatementError as exc:
        where = str(exc).removeprefix("rule statement: ")
        form.add_error("sql", where[:1].upper() + where[1:])
        form.statement_error = _pointer(form.data.get("sql", ""), exc.line, exc.column)
        return False
    except ServiceError as exc:
        field, text = _field_of(str(exc))
        form.add_error(field, text[:1].upper() + text[1:])
        return False
    return True


# the validator's words -> the form field they are about, per action
_FIELD_WORDS = {
    "republish": [("topic", "topic"), ("qos", "qos"), ("retain", "retain"), ("payload", "payload")],
    "webhook": [("header", "headers"), ("method", "method"), ("body", "body"), ("timeout", "timeout"),
                ("retries", "retries"), ("url", "url"), ("host", "url"), ("http", "url")],
    "store": [("dataset", "dataset")],
}


def _field_of(message: str) -> tuple[str | None, str]:
    """``(field, text)`` of a refused action ("webhook: the URL must ..." -> ``url``)."""
    kind, sep, text = message.partition(": ")
    if not sep or kind not in _FIELD_WORDS:
        return None, message
    lowered = text.lower()
    return next((field for word, field in _FIELD_WORDS[kind] if word in lowered), None), text


def _pointer(sql: str, line: int | None, column: int | None) -> dict:
    """The statement's faulty line and a caret under its column, for the editor."""
    lines = sql.splitlines()
    text = lines[line - 1] if line and 0 < line <= len(lines) else None
    caret = " " * (len(f"{line} | ") + column - 1) + "^" if text is not None and column else ""
    return {"line": line, "column": column, "text": text, "caret": caret}


@login_required
@require_safe
def rules_page(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    return _editor(request, _context(request, tenant, rw))


@login_required
@require_safe
def rules_table(request, slug):
    """The counters table alone (the page polls it)."""
    tenant, rw = get_tenant_for_user(request, slug)
    return render(request, TABLE, _context(request, tenant, rw, form=False))


@login_required
def rule_add(request, slug):
    tenant, rw = get_tenant_for_user(request, slug, write=True)
    if request.method != "POST":
        return redirect("rules", slug=slug)
    form = RuleForm(request.POST)
    added = []
    if _save(request, form, lambda f: added.append(rule_service.add_rule(
            tenant, sql=f.cleaned_data["sql"], action=f.cleaned_data["action"], config=f.action_config(),
            request=request))):
        messages.success(request, f"Rule {added[0].pk} added; the nodes run it within about a second.")
        if not wants_fragment(request):
            return redirect("rules", slug=slug)
        form = None
    return _editor(request, _context(request, tenant, rw, form=form))


@login_required
def rule_edit(request, slug, rule_id):
    rule, rw = get_processing_rule_for_user(request, slug, rule_id, write=True)
    tenant = rule.tenant
    if request.method == "POST":
        form = RuleForm(request.POST, default_action=rule.action)
        if _save(request, form, lambda f: rule_service.update_rule(
                rule, sql=f.cleaned_data["sql"], action=f.cleaned_data["action"],
                config=_kept(rule, f.cleaned_data["action"], f.action_config()), request=request)):
            messages.success(request, f"Rule {rule.pk} saved; its counters start again from zero.")
            if not wants_fragment(request):
                return redirect("rules", slug=slug)
            return _editor(request, _context(request, tenant, rw))
    else:
        form = RuleForm(initial=RuleForm.initial_for(rule))
    return _editor(request, _context(request, tenant, rw, form=form, editing=rule))


def _kept(rule, action: str, config: dict) -> dict:
    """The form's action settings plus those the form does not edit (a republish
    rule's user properties, set with ``manage.py rules`` or the service), so saving keeps them."""
    if action == rule.action == "republish" and rule.config.get("user_properties"):
        config["user_properties"] = rule.config["user_properties"]
    return config


def _set_enabled(request, slug, rule_id, enabled: bool):
    rule, rw = get_processing_rule_for_user(request, slug, rule_id, write=True)
    if rule.enabled != enabled:
        rule_service.set_rule_enabled(rule, enabled, request=request)
        messages.success(request, f"Rule {rule.pk} {'enabled' if enabled else 'disabled'}.")
    if not wants_fragment(request):
        return redirect("rules", slug=slug)
    return _editor(request, _context(request, rule.tenant, rw))


@login_required
@require_POST
def rule_enable(request, slug, rule_id):
    return _set_enabled(request, slug, rule_id, True)


@login_required
@require_POST
def rule_disable(request, slug, rule_id):
    return _set_enabled(request, slug, rule_id, False)


@login_required
def rule_delete(request, slug, rule_id):
    rule, rw = get_processing_rule_for_user(request, slug, rule_id, write=True)
    if request.method == "POST":
        pk = rule.pk
        rule_service.delete_rule(rule, request=request)
        messages.success(request, f"Rule {pk} deleted.")
        if not wants_fragment(request):
            return redirect("rules", slug=slug)
        return _editor(request, _context(request, rule.tenant, rw))
    return render(request, "tenants/rule_delete.html", {"tenant": rule.tenant, "rw": rw, "rule": rule})


@login_required
@require_POST
def rule_test(request, slug):
    """What the statement outputs for this message: the row, "no row" or the
    error -- nothing is published, stored, counted or audited (readers may run it)."""
    tenant, rw = get_tenant_for_user(request, slug)
    form = RuleTestForm(request.POST)
    test = None
    if form.is_valid():
        d = form.cleaned_data
        try:
            row = rule_service.test_rule(d["sql"], topic=d["test_topic"], payload=d["test_payload"].encode(),
                                         client_id=d["test_client_id"] or "test-client",
                                         timestamp_ms=int(dt.datetime.now(dt.UTC).timestamp() * 1000),
                                         event_topic=d["test_event_topic"], reason=d["test_reason"])
        except ServiceError as exc:
            test = {"error": str(exc)}
        else:
            test = {"row": rule_service.row_json(row) if row is not None else None}
    if wants_fragment(request):
        return render(request, "tenants/partials/rule_test.html", {"test_form": form, "test": test})
    rule_form = RuleForm(request.POST) if rw else None
    return render(request, PAGE, _context(request, tenant, rw, form=rule_form, test_form=form, test=test))
