"""The live metrics websockets (Channels), fed by the process's hub.

- ``/ws/metrics/``: the whole cluster, platform administrators only
  (``?node=ID`` adds that node's recent points to the first message, for
  the node page);
- ``/ws/metrics/tenants/<slug>/``: one tenant, for its members and the
  platform administrators.

Anyone else is refused before the handshake completes (close code 4401 for
an anonymous socket, 4403 for a signed-in user without access; browsers
see a failed handshake). The first message is ``{"type": "hello", ...}``
with the recent chart points and the last update; then one
``{"type": "update", ...}`` per poll (see ``metrics.hub``). The sockets
only listen: a message from the browser closes its socket (1008).

Access is asked again, from the session as stored now, as soon as the console
changes something it depends on (``metrics.signals``: the user signed out, was
changed or deleted, or lost a membership) and at most every ``RECHECK_EVERY``
seconds otherwise (a session that expired): a user who signed out, a member
removed from the tenant or an administrator no longer staff is closed (4401 /
4403) instead of receiving the figures for as long as the page stays open.
"""

import time
from importlib import import_module

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from core.roles import is_platform_admin
from tenants.access import membership_of
from tenants.models import Tenant

from .hub import get_hub
from .signals import user_group

ANONYMOUS = 4401
FORBIDDEN = 4403
SENT_SOMETHING = 1008    # policy violation: these sockets only listen
RECHECK_EVERY = 5.0     # seconds between two checks of an open socket's access


def may_watch(user, slug: str | None) -> bool:
    """The cluster: platform administrators. A tenant: its members too."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if is_platform_admin(user):
        return True
    if slug is None:
        return False
    tenant = Tenant.objects.filter(slug=slug).first()
    return tenant is not None and membership_of(user, tenant) is not None


def reused_since(slug: str | None) -> float | None:
    """When the tenant's slug was given again after a deleted tenant had it (``Tenant.usage_since``),
    as a Unix time; None otherwise: the hub's points of the slug before it are the deleted tenant's."""
    if not slug:
        return None
    since = Tenant.objects.filter(slug=slug).values_list("usage_since", flat=True).first()
    return since.timestamp() if since is not None else None


class MetricsConsumer(AsyncJsonWebsocketConsumer):
    slug: str | None = None
    group: str | None = None
    user_id = None
    checked_at = 0.0

    async def connect(self):
        user = self.scope.get("user")
        self.slug = self.scope["url_route"]["kwargs"].get("slug")
        if user is None or not user.is_authenticated:
            await self.close(code=ANONYMOUS)
            return
        if not await database_sync_to_async(may_watch)(user, self.slug):
            await self.close(code=FORBIDDEN)
            return
        self.user_id, self.checked_at = user.pk, time.monotonic()
        since = await database_sync_to_async(reused_since)(self.slug)
        hub = get_hub()
        hub.ensure_started()
        self.group = hub.group(self.slug)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(user_group(self.user_id), self.channel_name)
        hub.watch(self.slug)
        await self.accept()
        node = None
        if not self.slug:
            for part in self.scope.get("query_string", b"").decode("latin-1").split("&"):
                if part.startswith("node="):
                    node = part[5:] or None
        await self.send_json(hub.hello(self.slug, node, since=since))

    async def disconnect(self, code):
        if self.group is not None:
            get_hub().unwatch(self.slug)
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)
            self.group = None

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        # listen-only: a page never sends. Whatever comes closes the socket, undecoded -- a socket
        # that sent messages faster than they were decoded (JSON, up to daphne's 1 MiB each) had
        # them queued in the console's memory without bound
        await self.disconnect(SENT_SOMETHING)
        await self.close(code=SENT_SOMETHING)

    async def refusal(self) -> int | None:
        """Why the socket may no longer watch (its close code), from the session
        as stored now and the user's memberships now; None: it still may."""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None)
        if not key:
            return ANONYMOUS
        stored = import_module(settings.SESSION_ENGINE).SessionStore(key)
        user = await get_user({"session": stored})     # anonymous once signed out, expired or the password changed
        if not user.is_authenticated or user.pk != self.user_id:
            return ANONYMOUS
        if not await database_sync_to_async(may_watch)(user, self.slug):
            return FORBIDDEN
        return None

    async def _still_allowed(self) -> bool:
        """Check access now; closed (4401 / 4403) if it went. -> whether the socket stays."""
        self.checked_at = time.monotonic()
        code = await self.refusal()
        if code is None:
            return True
        await self.disconnect(code)
        await self.close(code=code)
        return False

    async def metrics_access_changed(self, event):
        """The console changed what this user's access depends on (``metrics.signals``)."""
        if self.group is not None:
            await self._still_allowed()

    async def metrics_update(self, event):
        if self.group is None:
            return
        if time.monotonic() - self.checked_at >= RECHECK_EVERY and not await self._still_allowed():
            return
        await self.send_json(event["payload"])
