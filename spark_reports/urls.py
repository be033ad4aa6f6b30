"""URLs of the reports: ``tenant_patterns`` under /tenants/<slug>/reports/,
``urlpatterns`` (the platform report) under /reports/."""

from django.urls import path

from . import views

tenant_patterns = [
    path("", views.tenant_reports, name="reports"),
    path("<int:run_id>/", views.tenant_report, name="report"),
    path("<int:run_id>/status/", views.tenant_report_status, name="report_status"),
    path("<int:run_id>/csv/", views.tenant_report_csv, name="report_csv"),
    path("<int:run_id>/print/", views.tenant_report_print, name="report_print"),
    path("<int:run_id>/retry/", views.tenant_report_retry, name="report_retry"),
    path("schedules/", views.schedule_list, name="report_schedules"),
    path("schedules/<int:schedule_id>/edit/", views.schedule_edit, name="report_schedule_edit"),
    path("schedules/<int:schedule_id>/send/", views.schedule_send, name="report_schedule_send"),
    path("schedules/<int:schedule_id>/toggle/", views.schedule_toggle, name="report_schedule_toggle"),
    path("schedules/<int:schedule_id>/delete/", views.schedule_delete, name="report_schedule_delete"),
]

urlpatterns = [
    path("", views.platform_reports, name="platform_reports"),
    path("<int:run_id>/", views.platform_report, name="platform_report"),
    path("<int:run_id>/status/", views.platform_report_status, name="platform_report_status"),
    path("<int:run_id>/csv/", views.platform_report_csv, name="platform_report_csv"),
    path("<int:run_id>/print/", views.platform_report_print, name="platform_report_print"),
    path("<int:run_id>/retry/", views.platform_report_retry, name="platform_report_retry"),
]
