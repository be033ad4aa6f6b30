"""ASGI entry point, served by daphne: HTTP (Django) and the live metrics
websockets (Channels: session authentication, allowed origins only)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from metrics.hub import HubStarter  # noqa: E402
from metrics.routing import websocket_urlpatterns  # noqa: E402

application = HubStarter(ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
}))
