"""The control plane inside brokerd: tenants' credentials, ACLs, quotas and
system-topic settings, read from the policy snapshots the console publishes
(``tenants_policysnapshot``), cached in the node and enforced on every
connection and packet. Imports no Django."""
