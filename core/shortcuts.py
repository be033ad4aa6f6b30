"""Small helpers every app's views share: fragments for htmx, service
errors onto forms, paging, the bound POST, the "next" redirect, and calls to
brokerd that degrade to a banner."""

import re

from django.core.paginator import Paginator
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.http import url_has_allowed_host_and_scheme

from .brokerd_client import BrokerdError, BrokerdInterrupted, BrokerdUnavailable, client_for
from .roles import is_platform_admin

PER_PAGE = 50


def wants_fragment(request) -> bool:
    """An htmx request that swaps part of the page (a history restore wants the whole page)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request and not htmx.boosted


def render_page(request, template: str, partial: str, context: dict, status: int = 200):
    """The whole page, or for htmx only the fragment (with pending flash
    messages swapped out of band into the page's message area)."""
    if wants_fragment(request):
        response = render(request, partial, context, status=status)
        oob = render_to_string("core/partials/messages.html", {"oob": True}, request=request)
        response.content += oob.encode()
        return response
    return render(request, template, context, status=status)


_FIELD_PREFIX = re.compile(r"^([a-z_]+)(?::| )\s*(.*)$", re.S)


def apply_service_error(form, error, aliases: dict | None = None) -> None:
    """Put a ServiceError's message(s) under the form fields they name
    ("topic: invalid ..." or "max_connections may not ..."), the rest on top."""
    aliases = aliases or {}
    for part in str(error).split("; "):
        m = _FIELD_PREFIX.match(part)
        if m:
            name = aliases.get(m.group(1), m.group(1))
            if name in form.fields:
                text = m.group(2) if part[len(m.group(1))] == ":" else part
                form.add_error(name, text[:1].upper() + text[1:])
                continue
        form.add_error(None, part[:1].upper() + part[1:])


def posted(request):
    """The submitted data of a POST, else None: a form is bound on every POST,
    also one whose fields are all optional and left out (``request.POST or
    None`` would treat that as a GET and silently do nothing)."""
    return request.POST if request.method == "POST" else None


def redirect_back(request, default: str):
    """Back to the page a form came from (its "next" field) when that is a path
    on this site; anything else -- another host, a scheme, a URL name -- goes
    to ``default``."""
    target = request.POST.get("next") or ""
    if not (target.startswith("/") and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure())):
        target = default
    return HttpResponseRedirect(target)


def paginate(request, queryset, per_page: int = PER_PAGE):
    paginator = Paginator(queryset, per_page)
    return paginator.get_page(request.GET.get("page"))


# what tenant users are told when no node answers, or a write was cut off: the nodes'
# admin addresses (in the full messages) are the platform's internal network
UNAVAILABLE = "brokerd admin API unreachable: no node answered"
INTERRUPTED = ("brokerd stopped answering after the request was sent: it may have been carried out "
               "-- check before trying again")


class Live:
    """brokerd for one request: ``call`` returns the answer, or None after
    noting the failure (``unavailable`` -> the banner, ``error`` -> a message).
    Which node failed, and how, is for platform administrators only."""

    def __init__(self, request):
        self.api = client_for(request.user)
        self.detailed = is_platform_admin(request.user)
        self.unavailable: str | None = None
        self.error: BrokerdError | None = None

    def call(self, method: str, *args, **kwargs):
        if self.unavailable:
            return None
        try:
            return getattr(self.api, method)(*args, **kwargs)
        except BrokerdUnavailable as exc:
            self.unavailable = exc.message if self.detailed else UNAVAILABLE
        except BrokerdInterrupted as exc:
            self.error = exc if self.detailed else BrokerdInterrupted(INTERRUPTED)
        except BrokerdError as exc:
            # an answer of the API: said as is, but a server error may name nodes, hosts, the store
            self.error = exc if self.detailed or exc.status < 500 else BrokerdError(
                exc.status, f"brokerd could not carry out the request (HTTP {exc.status}); try again later")
        return None

    def context(self) -> dict:
        return {"brokerd_unavailable": self.unavailable}


def page_numbers(page: int, pages: int) -> dict:
    """Pager data for an API answer's page/pages."""
    pages = max(1, pages or 1)
    return {"number": page, "pages": pages, "has_previous": page > 1, "has_next": page < pages,
            "previous": page - 1, "next": page + 1}
