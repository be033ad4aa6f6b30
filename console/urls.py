"""Console URLs. The staff pages and the tenant portal arrive with issue #6."""

from django.urls import path

from . import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
]
