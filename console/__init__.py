"""The Django project: settings, URLs, ASGI application and the staff console."""
