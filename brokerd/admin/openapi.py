"""The OpenAPI 3.0 description of the admin API, served at ``/openapi.json``."""

from .. import __version__

_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_AUTH = {"401": {"description": "missing, unknown or revoked token (answered from the headers: the body is not "
                                "read, and the connection is closed)", **_ERR},
         "403": {"description": "a read token tried to write, or a token other than the console's own "
                                "(BROKERD_ADMIN_TOKEN) sent X-On-Behalf-Of", **_ERR}}
# a request with a body: refused from its headers before the body is read, and the connection closed
_BODY = {"413": {"description": "the body is larger than the node takes (Content-Length above 4 MiB or "
                                "--admin-body-budget)", **_ERR},
         "503": {"description": "the node holds --admin-body-budget bytes of other requests' bodies: try again "
                                "(Retry-After)", **_ERR}}


def _q(name, desc, required=False, schema=None):
    return {"name": name, "in": "query", "required": required, "description": desc,
            "schema": schema or {"type": "string"}}


def _p(name, desc):
    return {"name": name, "in": "path", "required": True, "description": desc, "schema": {"type": "string"}}


def _json(ref):
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


# a client action asked of a node that does not hold the session is passed to the one that does
_PEER = {"502": {"description": "the node that holds the session did not answer", **_ERR}}

_PAGE = [_q("page", "page number, from 1", schema={"type": "integer", "minimum": 1, "default": 1}),
         _q("per_page", "items per page", schema={"type": "integer", "minimum": 1, "maximum": 1000, "default": 50})]
_CLIENT = [_p("tenant", "tenant slug"), _p("client_id", "MQTT client identifier")]

OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "brokerd admin API", "version": __version__,
             "description": "Inspect and act on a brokerd cluster. Asked on any node, it answers for the whole "
                            "cluster. Bearer tokens are created in the console; GET needs a read token, POST and "
                            "DELETE a write token."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
            "Totals": {"type": "object", "properties": {
                **{k: {"type": "integer"} for k in ("connections", "connections_max", "connects", "disconnects",
                                                     "bytes_in", "bytes_out", "auth_failures", "retained",
                                                     "subscriptions", "queued", "inflight")},
                "rule_actions_dropped": {"type": "integer", "description": "rules' webhook requests and telemetry "
                                         "rows dropped from their full buffers (by the rules' current counters)"},
                "messages_in": {"type": "object", "description": "PUBLISH packets by QoS ('0', '1', '2')",
                                "additionalProperties": {"type": "integer"}},
                "messages_out": {"type": "object", "additionalProperties": {"type": "integer"}},
                "dropped": {"type": "object", "description": "by reason: queue_full, expired, too_large, "
                            "no_subscribers, acl_denied, quota", "additionalProperties": {"type": "integer"}}}},
            "NodeMetrics": {"allOf": [{"$ref": "#/components/schemas/Totals"}, {"type": "object", "properties": {
                "node": {"type": "string"}, "host": {"type": "string", "description": "the host's --node-id (this node's own id without --workers)"},
                "worker": {"type": "integer", "nullable": True, "description": "its slot among the host's "
                           "--workers N processes (null: one process)"},
                "health": {"type": "string", "enum": ["ok", "fenced", "unreachable"]},
                "uptime": {"type": "number"}, "loop_lag": {"type": "number", "description": "seconds, worst of 5 s"},
                "cpu_seconds": {"type": "number"}, "memory_rss": {"type": "integer"},
                "open_fds": {"type": "integer"},
                "store": {"type": "object", "description": "the session store: backend, healthy, error, writes, "
                          "writes_dropped (operations it can never take, dropped and logged, not retried), "
                          "last_dropped, writes_given_up (not taken by the store before the others could adopt "
                          "the sessions of this node, fenced: given up, never written later)"},
                "admin": {"type": "object", "description": "this admin API: connections, max_connections, "
                          "refused (closed at accept over the cap), timed_out, rejected (answered before the "
                          "body), body_bytes, body_budget"},
                "latency": {"type": "object", "description": "histogram of 1 in 64 deliveries: cumulative "
                            "[le_seconds, count] buckets, sum, count"},
                "tenants": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Totals"}}}}]},
            "Metrics": {"type": "object", "properties": {
                "at": {"type": "number", "description": "unix time of the answer"},
                "items": {"type": "array", "items": {"$ref": "#/components/schemas/NodeMetrics"}},
                "nodes": {"type": "array", "items": {"$ref": "#/components/schemas/NodeMetrics"}},
                "cluster": {"$ref": "#/components/schemas/Totals"},
                "tenants": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Totals"}}}},
            "Node": {"type": "object", "properties": {
                "id": {"type": "string"}, "host": {"type": "string", "description": "the host's --node-id (this node's own id without --workers)"},
                "worker": {"type": "integer", "nullable": True, "description": "its slot among the host's "
                           "--workers N processes (null: one process)"}, "pid": {"type": "integer"},
                "health": {"type": "string", "enum": ["ok", "fenced", "unreachable"]},
                "uptime": {"type": "number"}, "listeners": {"type": "array", "items": {"type": "string"},
                                                             "description": "the MQTT listeners as bound"},
                "mqtt": {"type": "array", "items": {"type": "string"}, "description": "the MQTT listeners' URLs "
                         "as clients reach them (--advertise-host, else the bound host; a wildcard bind: the "
                         "host name)"},
                "admin": {"type": "string"}, "connected": {"type": "integer"}, "sessions": {"type": "integer"},
                "subscriptions": {"type": "integer"}, "retained": {"type": "integer"},
                "messages_received": {"type": "integer"}, "messages_sent": {"type": "integer"},
                "bytes_received": {"type": "integer"}, "bytes_sent": {"type": "integer"}}, "required": ["id"]},
            "Client": {"type": "object", "properties": {
                "node": {"type": "string"}, "tenant": {"type": "string"}, "client_id": {"type": "string"},
                "username": {"type": "string", "nullable": True}, "device": {"type": "string", "nullable": True},
                "ip": {"type": "string", "nullable": True}, "protocol": {"type": "string", "nullable": True},
                "connected": {"type": "boolean"}, "connected_at": {"type": "number", "nullable": True},
                "keepalive": {"type": "integer", "nullable": True}, "session_expiry": {"type": "integer"},
                "subscriptions": {}, "queued": {"type": "integer"}, "inflight": {"type": "integer"},
                "messages_in": {"type": "integer"}, "messages_out": {"type": "integer"},
                "bytes_in": {"type": "integer"}, "bytes_out": {"type": "integer"},
                "paced": {"type": "integer", "description": "times the node stopped reading this client "
                          "because its messages filled the queue budget (--queue-budget)"}},
                "required": ["node", "tenant", "client_id", "connected"]},
            "Page": {"type": "object", "properties": {
                "items": {"type": "array", "items": {}}, "page": {"type": "integer"},
                "per_page": {"type": "integer"}, "total": {"type": "integer"}, "pages": {"type": "integer"}},
                "required": ["items", "page", "per_page", "total", "pages"]},
            "SubscriptionRequest": {"type": "object", "properties": {
                "filter": {"type": "string"}, "qos": {"type": "integer", "enum": [0, 1, 2]},
                "no_local": {"type": "boolean"}, "retain_as_published": {"type": "boolean"},
                "retain_handling": {"type": "integer", "enum": [0, 1, 2]}}, "required": ["filter"],
                "additionalProperties": False},
            "PublishRequest": {"type": "object", "properties": {
                "tenant": {"type": "string"}, "topic": {"type": "string"}, "payload": {"type": "string"},
                "payload_encoding": {"type": "string", "enum": ["utf8", "base64"], "default": "utf8"},
                "qos": {"type": "integer", "enum": [0, 1, 2]}, "retain": {"type": "boolean"},
                "content_type": {"type": "string"},
                "message_expiry": {"type": "integer", "minimum": 0, "maximum": 4294967295},
                "user_properties": {"type": "object", "additionalProperties": {"type": "string"}}},
                "required": ["tenant", "topic"], "additionalProperties": False,
                "description": "the topic may not start with '$'; the PUBLISH packet must fit the node's "
                               "maximum packet size"},
            "Retained": {"type": "object", "properties": {
                "tenant": {"type": "string"}, "topic": {"type": "string"}, "qos": {"type": "integer"},
                "size": {"type": "integer"}, "expires_at": {"type": "number", "nullable": True},
                "payload": {"type": "string"}, "payload_encoding": {"type": "string"}},
                "required": ["tenant", "topic", "qos", "size"]},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {"get": {"summary": "liveness of this node", "security": [],
                             "responses": {"200": {"description": "alive"}}}},
        "/openapi.json": {"get": {"summary": "this document", "security": [],
                                  "responses": {"200": {"description": "the OpenAPI document"}}}},
        "/api/v1/nodes": {"get": {"summary": "the cluster's nodes and their health",
                                  "responses": {"200": {"description": "nodes", "content": {"application/json": {
                                      "schema": {"type": "object", "properties": {"items": {
                                          "type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}}}},
                                      **_AUTH}}},
        "/api/v1/metrics": {"get": {
            "summary": "every node's figures, the cluster's and each tenant's totals (counters are cumulative "
                       "since each node started; rates are the caller's differences)",
            "parameters": [_q("local", "1: this node only", schema={"type": "string", "enum": ["1"]})],
            "responses": {"200": {"description": "metrics", **_json("Metrics")}, **_AUTH}}},
        "/metrics": {"get": {
            "summary": "this node's figures in the Prometheus text format (tenant and node as labels)",
            "responses": {"200": {"description": "Prometheus exposition",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}, **_AUTH}}},
        "/api/v1/clients": {"get": {
            "summary": "clients and persistent sessions, searched across the cluster",
            "parameters": [_q("tenant", "tenant slug"), _q("client_id", "part of the client id"),
                           _q("username", "exact user name"), _q("ip", "client address"), _q("node", "node id"),
                           _q("connected", "only connected (true) or offline sessions (false)",
                              schema={"type": "string", "enum": ["true", "false"]}), *_PAGE],
            "responses": {"200": {"description": "a page of clients", **_json("Page")}, **_AUTH}}},
        "/api/v1/clients/{tenant}/{client_id}": {
            "get": {"summary": "one client's session: subscriptions, queue depth, inflight, connection",
                    "parameters": _CLIENT,
                    "responses": {"200": {"description": "the session", **_json("Client")},
                                  "404": {"description": "no such client", **_ERR}, **_AUTH, **_PEER}},
            "delete": {"summary": "disconnect a client (v5: DISCONNECT 0x98), optionally ending its session",
                       "parameters": [*_CLIENT, _q("clear_session", "also end the session",
                                                   schema={"type": "boolean"})],
                       "responses": {"200": {"description": "kicked"}, "404": {"description": "no such client", **_ERR},
                                     **_AUTH, **_PEER}}},
        "/api/v1/clients/{tenant}/{client_id}/subscriptions": {
            "post": {"summary": "subscribe the client (its ACL does not apply to administrators)",
                     "parameters": _CLIENT, "requestBody": {"required": True, **_json("SubscriptionRequest")},
                     "responses": {"201": {"description": "subscribed"},
                                   "400": {"description": "invalid (a field out of its range, an unknown field, "
                                                          "JSON that is not an object)", **_ERR},
                                   "404": {"description": "no such client", **_ERR}, **_AUTH, **_PEER, **_BODY}},
            "delete": {"summary": "remove one of the client's subscriptions",
                       "parameters": [*_CLIENT, _q("filter", "the topic filter", required=True)],
                       "responses": {"200": {"description": "removed"},
                                     "404": {"description": "no such client or subscription", **_ERR}, **_AUTH, **_PEER}}},
        "/api/v1/publish": {"post": {
            "summary": "publish a message in a tenant's topic space",
            "requestBody": {"required": True, **_json("PublishRequest")},
            "responses": {"200": {"description": "published (deliveries on the nodes reached)"},
                          "400": {"description": "invalid: a field out of its MQTT range (qos 0..2, "
                                                 "message_expiry 0..4294967295, strings), an unknown field, a "
                                                 "'$' topic, a message larger than the node's maximum packet "
                                                 "size, JSON that is not an object", **_ERR},
                          "404": {"description": "no such tenant", **_ERR}, **_AUTH, **_BODY}}},
        "/api/v1/tenants/{tenant}/rules": {"get": {
            "summary": "a tenant's rules as the nodes run them: per rule matched (FROM matched), passed (WHERE "
                       "true, action done), no_result (WHERE not true), failed, last_error and last_error_at "
                       "(unix seconds); webhook rules also sent (2xx received), retried (attempts after a first) "
                       "and dropped (the buffer was full: also failed); store rules stored (rows written to the "
                       "landing zone) and dropped (buffer full or write failed: also failed); summed over the "
                       "nodes, each node's own "
                       "under 'nodes'",
            "parameters": [_p("tenant", "tenant slug"),
                           _q("local", "1: this node's figures only")],
            "responses": {"200": {"description": "{tenant, items: [rule]} (a tenant without rules: no items)"},
                          **_AUTH}}},
        "/api/v1/tenants/{tenant}/delayed": {"get": {
            "summary": "a tenant's delayed messages ($delayed/{seconds}/{topic}) waiting to be published "
                       "(pending, in the store: the cluster's when the nodes share one) and its cap (limit: "
                       "the tenant's quota max_delayed or the node's --max-delayed, the smaller; null: none)",
            "parameters": [_p("tenant", "tenant slug"),
                           _q("local", "1: this node's own count only (nodes without a shared store)")],
            "responses": {"200": {"description": "{tenant, enabled, pending, limit, items: [{node, pending}]}"},
                          "503": {"description": "the store did not answer", **_ERR}, **_AUTH}}},
        "/api/v1/retained": {
            "get": {"summary": "retained messages of a tenant (list by topic prefix, or one with 'topic')",
                    "parameters": [_q("tenant", "tenant slug", required=True), _q("prefix", "topic prefix"),
                                   _q("topic", "one topic: its message with payload"),
                                   _q("sys", "1: list the broker's own $SYS/... messages too (default 0)"), *_PAGE],
                    "responses": {"200": {"description": "a page of retained messages, or one"},
                                  "404": {"description": "no retained message", **_ERR}, **_AUTH}},
            "delete": {"summary": "clear a retained message (on every node; nothing is sent to current subscribers)",
                       "parameters": [_q("tenant", "tenant slug", required=True),
                                      _q("topic", "topic", required=True)],
                       "responses": {"200": {"description": "cleared"}, "404": {"description": "none", **_ERR},
                                     "400": {"description": "a '$' topic (the broker's own)", **_ERR},
                                     **_AUTH}}},
    },
}
