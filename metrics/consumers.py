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
only listen: whatever a browser sends is ignored.
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from core.roles import is_platform_admin
from tenants.access import membership_of
from tenants.models import Tenant

from .hub import get_hub

ANONYMOUS = 4401
FORBIDDEN = 4403


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


class MetricsConsumer(AsyncJsonWebsocketConsumer):
    slug: str | None = None
    group: str | None = None

    async def connect(self):
        user = self.scope.get("user")
        self.slug = self.scope["url_route"]["kwargs"].get("slug")
        if user is None or not user.is_authenticated:
            await self.close(code=ANONYMOUS)
            return
        if not await database_sync_to_async(may_watch)(user, self.slug):
            await self.close(code=FORBIDDEN)
            return
        hub = get_hub()
        hub.ensure_started()
        self.group = hub.group(self.slug)
        await self.channel_layer.group_add(self.group, self.channel_name)
        hub.watch(self.slug)
        await self.accept()
        node = None
        if not self.slug:
            for part in self.scope.get("query_string", b"").decode("latin-1").split("&"):
                if part.startswith("node="):
                    node = part[5:] or None
        await self.send_json(hub.hello(self.slug, node))

    async def disconnect(self, code):
        if self.group is not None:
            get_hub().unwatch(self.slug)
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None

    async def receive_json(self, content, **kwargs):
        pass        # listen-only

    async def metrics_update(self, event):
        await self.send_json(event["payload"])
