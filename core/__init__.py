"""The ground floor of the console: what every Django app of the project
stands on, knowing none of them.

- ``roles``: the platform administrator, the ``@platform_admin_required``
  decorator and the page's scope (tenant, role, read-write) for the layout;
- ``audit`` and ``models.AuditEvent``: the audit log brokerd writes too;
- ``shortcuts``: htmx fragments, paging, service errors onto forms, the
  "next" redirect, brokerd calls that degrade to a banner;
- ``brokerd_client``: the console's client of brokerd's admin API;
- ``forms``/``views``: the audit log's filter and page, shared by the
  platform's log and a tenant's.

The rule (``tests/test_layering.py``): ``core`` imports no other app of the
project. Anything that needs a tenant lives in ``tenants`` (``tenants.access``
builds the tenant-scoped lookups on ``core.roles``); ``console`` is the top
floor that may import everything.
"""
