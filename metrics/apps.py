from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "metrics"

    def ready(self):
        from . import signals

        signals.connect()
