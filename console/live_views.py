"""The live pages, acting on the cluster through brokerd's admin API
(``core.brokerd_client``): clients and their sessions, kick, subscriptions,
retained messages and test publishes.

brokerd writes the audit rows of these actions itself (it is told the console
user with ``X-On-Behalf-Of``), so these views write none. When no node
answers, pages show the banner instead of failing.
"""

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.roles import platform_admin_required
from core.shortcuts import Live, page_numbers, render_page, wants_fragment
from tenants.access import get_live_scope_for_user

from .forms import (
    ClientFilterForm,
    KickForm,
    PublishForm,
    RetainedFilterForm,
    SubscriptionForm,
    UnsubscribeForm,
)

PER_PAGE = 50


def _clients_page(request, form, context, template):
    live = Live(request)
    q = form.query()
    answer = live.call("clients", per_page=PER_PAGE, **q)
    context.update({"form": form, "clients": answer["items"] if answer else None,
                    "total": answer["total"] if answer else None,
                    "pager": page_numbers(answer["page"], answer.get("pages", 1)) if answer else None,
                    "query": {k: v for k, v in q.items() if v and k != "page"},
                    "api_error": live.error.message if live.error else None, **live.context()})
    return render_page(request, template, "console/partials/client_table.html", context)


@platform_admin_required
def clients(request):
    """Every client of the cluster, searchable."""
    form = ClientFilterForm(request.GET or None)
    return _clients_page(request, form, {"scoped": False}, "console/clients.html")


@login_required
def tenant_clients(request, slug):
    tenant, rw = get_live_scope_for_user(request, slug)
    form = ClientFilterForm(request.GET or None, fixed_tenant=slug)
    return _clients_page(request, form, {"scoped": True, "tenant": tenant, "slug": slug, "rw": rw},
                         "console/tenant_clients.html")


def _session(request, slug, client_id, live):
    return live.call("client", slug, client_id)


def _detail_context(request, slug, client_id, tenant, rw, live, session, sub_form=None):
    # gone: not connected and no stored session (brokerd answered 404), not merely unreachable
    gone = session is None and live.error is not None and live.error.status == 404
    # fragment: the page's 5-second refresh or a form of it -- the header's state and Kick
    # button (outside #session) come along out of band (console/partials/client_head.html)
    return {"tenant": tenant, "slug": slug, "rw": rw, "client_id": client_id, "session": session,
            "gone": gone, "fragment": wants_fragment(request), "sub_form": sub_form or SubscriptionForm(),
            **live.context()}


@login_required
def client_detail(request, slug, client_id):
    tenant, rw = get_live_scope_for_user(request, slug)
    live = Live(request)
    session = _session(request, slug, client_id, live)
    context = _detail_context(request, slug, client_id, tenant, rw, live, session)
    if context["gone"] and not context["fragment"]:
        return render(request, "console/client_gone.html", context, status=404)
    # a refresh after the client left: its fragment says so (a 404 was not swapped, and the
    # page kept showing the client connected)
    return render_page(request, "console/client_detail.html", "console/partials/session.html", context)


@login_required
def client_kick(request, slug, client_id):
    tenant, rw = get_live_scope_for_user(request, slug, write=True)
    # bound on every POST: an unticked checkbox sends nothing, and the form must still act
    form = KickForm(request.POST if request.method == "POST" else None)
    live = Live(request)
    if request.method == "POST" and form.is_valid():
        clear = form.cleaned_data["clear_session"]
        answer = live.call("kick", slug, client_id, clear_session=clear)
        if answer is not None:
            messages.success(request, f"Client {client_id} disconnected"
                                      f"{' and its session cleared' if clear else ''}.")
            return redirect("tenant_clients", slug=slug)
        if live.error is not None:
            form.add_error(None, live.error.message[:1].upper() + live.error.message[1:])
    return render(request, "console/client_kick.html",
                  {"tenant": tenant, "slug": slug, "rw": rw, "client_id": client_id, "form": form,
                   **live.context()})


@login_required
@require_POST
def client_subscribe(request, slug, client_id):
    tenant, rw = get_live_scope_for_user(request, slug, write=True)
    live = Live(request)
    form = SubscriptionForm(request.POST)
    if form.is_valid():
        answer = live.call("subscribe", slug, client_id, form.cleaned_data["filter"], form.cleaned_data["qos"])
        if answer is not None:
            messages.success(request, f"Subscribed {client_id} to {answer['filter']} (QoS {answer['qos']}).")
            if not request.htmx:
                return redirect("client_detail", slug=slug, client_id=client_id)
            form = None
        elif live.error is not None:
            form.add_error("filter", live.error.message[:1].upper() + live.error.message[1:])
    session = _session(request, slug, client_id, live) if not live.unavailable else None
    context = _detail_context(request, slug, client_id, tenant, rw, live, session, sub_form=form)
    return render_page(request, "console/client_detail.html", "console/partials/session.html", context)


@login_required
@require_POST
def client_unsubscribe(request, slug, client_id):
    get_live_scope_for_user(request, slug, write=True)
    live = Live(request)
    form = UnsubscribeForm(request.POST)
    if form.is_valid():
        if live.call("unsubscribe", slug, client_id, form.cleaned_data["filter"]) is not None:
            messages.success(request, f"Removed the subscription to {form.cleaned_data['filter']}.")
        elif live.error is not None:
            messages.error(request, live.error.message)
        elif live.unavailable:
            messages.error(request, live.unavailable)
    if request.htmx:
        tenant, rw = get_live_scope_for_user(request, slug)
        session = _session(request, slug, client_id, live) if not live.unavailable else None
        context = _detail_context(request, slug, client_id, tenant, rw, live, session)
        return render_page(request, "console/client_detail.html", "console/partials/session.html", context)
    return redirect("client_detail", slug=slug, client_id=client_id)


# ---------------------------------------------------------------- retained messages


@login_required
def retained(request, slug):
    tenant, rw = get_live_scope_for_user(request, slug)
    form = RetainedFilterForm(request.GET or None)
    d = form.cleaned_data if form.is_valid() else {}
    live = Live(request)
    answer = live.call("retained", slug, d.get("prefix") or "", page=d.get("page") or 1, per_page=PER_PAGE,
                       sys=bool(d.get("sys")))
    context = {"tenant": tenant, "slug": slug, "rw": rw, "form": form, "prefix": d.get("prefix") or "",
               "sys": bool(d.get("sys")),
               "messages_list": answer["items"] if answer else None, "total": answer["total"] if answer else None,
               "pager": page_numbers(answer["page"], answer.get("pages", 1)) if answer else None,
               **live.context()}
    return render_page(request, "console/retained.html", "console/partials/retained_table.html", context)


@login_required
def retained_message(request, slug):
    tenant, rw = get_live_scope_for_user(request, slug)
    topic = request.GET.get("topic", "")
    live = Live(request)
    message = live.call("retained_message", slug, topic) if topic else None
    context = {"tenant": tenant, "slug": slug, "rw": rw, "topic": topic, "message": message, **live.context()}
    status = 404 if message is None and not live.unavailable else 200
    return render(request, "console/retained_message.html", context, status=status)


@login_required
def retained_delete(request, slug):
    tenant, rw = get_live_scope_for_user(request, slug, write=True)
    topic = request.POST.get("topic") if request.method == "POST" else request.GET.get("topic", "")
    live = Live(request)
    if request.method == "POST":
        if live.call("delete_retained", slug, topic) is not None:
            messages.success(request, f"Retained message on {topic} deleted.")
            return redirect("retained", slug=slug)
        if live.error is not None:
            messages.error(request, live.error.message[:1].upper() + live.error.message[1:])
            return redirect("retained", slug=slug)
    return render(request, "console/retained_delete.html",
                  {"tenant": tenant, "slug": slug, "rw": rw, "topic": topic, **live.context()})


# ---------------------------------------------------------------- publish


@login_required
def publish(request, slug):
    tenant, rw = get_live_scope_for_user(request, slug, write=request.method == "POST")
    form = PublishForm(request.POST if request.method == "POST" else None)
    live = Live(request)
    result = None
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        result = live.call("publish", slug, d["topic"], d["payload"], qos=d["qos"], retain=d["retain"])
        if result is not None:
            n = result.get("deliveries")
            messages.success(request, f"Published to {d['topic']}"
                                      + (f": delivered to {n} subscriber{'s' if n != 1 else ''}." if n is not None
                                         else "."))
            if not request.htmx:
                return redirect(reverse("publish", args=[slug]) + "?" + urlencode({"topic": d["topic"]}))
        elif live.error is not None:
            form.add_error(None, live.error.message[:1].upper() + live.error.message[1:])
    elif request.method == "GET" and request.GET.get("topic"):
        form = PublishForm(initial={"topic": request.GET["topic"]})
    context = {"tenant": tenant, "slug": slug, "rw": rw, "form": form, "result": result, **live.context()}
    if wants_fragment(request):
        return render_page(request, "console/publish.html", "console/partials/publish_form.html", context)
    return render(request, "console/publish.html", context)
