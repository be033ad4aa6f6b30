"""Websocket URLs of the live metrics (included by console/asgi.py)."""

from django.urls import re_path

from .consumers import MetricsConsumer

websocket_urlpatterns = [
    re_path(r"^ws/metrics/$", MetricsConsumer.as_asgi()),
    re_path(r"^ws/metrics/tenants/(?P<slug>[a-z0-9-]{1,63})/$", MetricsConsumer.as_asgi()),
]
