"""Console URLs: the platform pages, and the tenant pages under
/tenants/<slug>/ shared by platform administrators and tenant users."""

from django.urls import include, path, register_converter

from metrics import views as mv
from spark_reports import urls as report_urls
from tenants import rule_views as rv
from tenants import views as tv

from . import api, views
from . import live_views as lv
from .converters import ClientIdConverter

register_converter(ClientIdConverter, "cid")

tenant_patterns = [
    path("", tv.tenant_overview, name="tenant"),
    path("edit/", views.tenant_edit, name="tenant_edit"),
    path("suspend/", views.tenant_suspend, name="tenant_suspend"),
    path("resume/", views.tenant_resume, name="tenant_resume"),
    path("delete/", views.tenant_delete, name="tenant_delete"),
    # devices and credentials
    path("devices/", tv.device_list, name="devices"),
    path("devices/new/", tv.device_create, name="device_create"),
    path("devices/new/import/", tv.device_import, name="device_import"),
    path("devices/<str:name>/", tv.device_detail, name="device"),
    path("devices/<str:name>/edit/", tv.device_edit, name="device_edit"),
    path("devices/<str:name>/enable/", tv.device_enable, name="device_enable"),
    path("devices/<str:name>/disable/", tv.device_disable, name="device_disable"),
    path("devices/<str:name>/delete/", tv.device_delete, name="device_delete"),
    path("devices/<str:name>/credentials/new/", tv.credential_create, name="credential_create"),
    path("devices/<str:name>/credentials/<int:credential_id>/rotate/", tv.credential_rotate,
         name="credential_rotate"),
    path("devices/<str:name>/credentials/<int:credential_id>/enable/", tv.credential_enable,
         name="credential_enable"),
    path("devices/<str:name>/credentials/<int:credential_id>/disable/", tv.credential_disable,
         name="credential_disable"),
    path("devices/<str:name>/credentials/<int:credential_id>/expire/", tv.credential_expire,
         name="credential_expire"),
    path("devices/<str:name>/credentials/<int:credential_id>/delete/", tv.credential_delete,
         name="credential_delete"),
    # ACL rules
    path("acl/", tv.acl_rules, name="acl"),
    path("acl/new/", tv.acl_add, name="acl_add"),
    path("acl/check/", tv.acl_check, name="acl_check"),
    path("acl/own-topics/", tv.acl_own_topics, name="acl_own_topics"),
    path("acl/<int:rule_id>/edit/", tv.acl_edit, name="acl_edit"),
    path("acl/<int:rule_id>/move/", tv.acl_move, name="acl_move"),
    path("acl/<int:rule_id>/delete/", tv.acl_delete, name="acl_delete"),
    # rules of the rule engine
    path("rules/", rv.rules_page, name="rules"),
    path("rules/table/", rv.rules_table, name="rules_table"),
    path("rules/new/", rv.rule_add, name="rule_add"),
    path("rules/test/", rv.rule_test, name="rule_test"),
    path("rules/<int:rule_id>/edit/", rv.rule_edit, name="rule_edit"),
    path("rules/<int:rule_id>/enable/", rv.rule_enable, name="rule_enable"),
    path("rules/<int:rule_id>/disable/", rv.rule_disable, name="rule_disable"),
    path("rules/<int:rule_id>/delete/", rv.rule_delete, name="rule_delete"),
    # limits and settings
    path("quotas/", tv.quotas, name="quotas"),
    path("system-topics/", tv.system_topics, name="system_topics"),
    path("members/", tv.members, name="members"),
    path("members/<int:membership_id>/role/", tv.member_role, name="member_role"),
    path("members/<int:membership_id>/remove/", tv.member_remove, name="member_remove"),
    path("audit/", tv.tenant_audit, name="tenant_audit"),
    # live (brokerd admin API)
    path("clients/", lv.tenant_clients, name="tenant_clients"),
    path("clients/<cid:client_id>/", lv.client_detail, name="client_detail"),
    path("clients/<cid:client_id>/kick/", lv.client_kick, name="client_kick"),
    path("clients/<cid:client_id>/subscriptions/", lv.client_subscribe, name="client_subscribe"),
    path("clients/<cid:client_id>/subscriptions/remove/", lv.client_unsubscribe, name="client_unsubscribe"),
    path("retained/", lv.retained, name="retained"),
    path("retained/message/", lv.retained_message, name="retained_message"),
    path("retained/delete/", lv.retained_delete, name="retained_delete"),
    path("publish/", lv.publish, name="publish"),
    # live metrics (metrics app)
    path("metrics/", mv.tenant, name="tenant_metrics"),
    path("metrics/history/", mv.tenant_history, name="tenant_metrics_history"),
    # usage reports (spark_reports app)
    path("reports/", include(report_urls.tenant_patterns)),
]

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    # browsers ask for /favicon.ico on pages that name no icon (a 404 on every such page)
    path("favicon.ico", views.favicon, name="favicon"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("account/password/", views.PasswordChangeView.as_view(), name="password_change"),
    path("", views.home, name="home"),
    path("overview/", views.overview, name="overview"),
    path("tenants/", views.tenant_list, name="tenant_list"),
    path("tenants/new/", views.tenant_create, name="tenant_create"),
    path("tenants/<slug:slug>/", include(tenant_patterns)),
    path("clients/", lv.clients, name="clients"),
    path("metrics/", include("metrics.urls")),
    path("reports/", include("spark_reports.urls")),
    path("audit/", views.audit_log, name="audit"),
    path("tokens/", views.token_list, name="token_list"),
    path("tokens/new/", views.token_create, name="token_create"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    # the console's REST API (console.api): bearer tokens, no session
    path("api/v1/openapi.json", api.openapi, name="api_openapi"),
    path("api/v1/tenants/<slug:slug>/rules", api.rules, name="api_rules"),
    path("api/v1/tenants/<slug:slug>/rules/test", api.rule_test, name="api_rule_test"),
    path("api/v1/tenants/<slug:slug>/rules/<int:rule_id>", api.rule, name="api_rule"),
    path("api/v1/tenants/<slug:slug>/rules/<int:rule_id>/enable", api.rule_enable, name="api_rule_enable"),
    path("api/v1/tenants/<slug:slug>/rules/<int:rule_id>/disable", api.rule_disable, name="api_rule_disable"),
]
