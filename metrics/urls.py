"""The platform's live metrics pages (under /metrics/); the tenant's dashboard
is under /tenants/<slug>/metrics/ (console/urls.py)."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.cluster, name="metrics"),
    path("history/", views.cluster_history, name="metrics_history"),
    # node ids are whatever brokerd was started with (--node-id), "/" included
    path("nodes/<path:node>/", views.node, name="metrics_node"),
    path("alarms/", views.alarm_list, name="alarms"),
    path("alarms/<int:alarm_id>/dismiss/", views.alarm_dismiss, name="alarm_dismiss"),
]
