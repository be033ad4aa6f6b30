"""The Django project: settings, URLs, ASGI application and the staff console."""

# Celery's app, so that tasks enqueued by the console find its configuration
from .celery import app as celery_app

__all__ = ["celery_app"]
