"""ASGI entry point, served by daphne: HTTP (Django) and the live metrics
websockets (Channels: session authentication, allowed origins only). The
client's address is the socket's peer, or what a trusted proxy says it is
(``console.forwarded``; daphne runs without ``--proxy-headers``)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.forwarded import ForwardedFor  # noqa: E402
from metrics.hub import HubStarter  # noqa: E402
from metrics.routing import websocket_urlpatterns  # noqa: E402

application = ForwardedFor(HubStarter(ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})))
