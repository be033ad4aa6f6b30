"""Tenants, devices, credentials, ACL rules, quotas and system-topic settings (issue #4)."""
