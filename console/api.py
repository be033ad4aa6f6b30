"""The console's REST API: what the console owns and the nodes only read --
today a tenant's rules (``tenants.rules``). brokerd's admin API serves what
the nodes own (clients, subscriptions, retained messages, the rules'
counters); the rules themselves live in the console's database and reach the
nodes with the policy snapshot, so changing them is the console's business.

    GET    /api/v1/tenants/{tenant}/rules                 the tenant's rules
    POST   /api/v1/tenants/{tenant}/rules                 add one: {sql, action, config, enabled?} -> 201
    GET    /api/v1/tenants/{tenant}/rules/{id}            one rule
    DELETE /api/v1/tenants/{tenant}/rules/{id}            delete it
    POST   /api/v1/tenants/{tenant}/rules/{id}/enable     enable it (and .../disable)
    POST   /api/v1/tenants/{tenant}/rules/test            {sql, topic, payload, client_id?, username?, qos?,
                                                           event_topic?, reason?}
                                                          -> {row}: the output row, null when WHERE is not
                                                          true; nothing stored, published or audited
    GET    /api/v1/openapi.json                           this API's OpenAPI document

The same tokens as brokerd's admin API (``console_apitoken``, made on the
console's API tokens page): ``Authorization: Bearer bkd_...``; GET needs
``read``, the rest ``write`` (but ``rules/test``, which changes nothing). A missing, unknown or revoked token is 401, a
read token that writes 403 -- a signed-in browser session is not a token
(the endpoints take no cookies, so they need no CSRF token). Validation is
the console's and ``manage.py rules``' own (brokerd's compiler and action
validator): a refused statement is 400 with its ``line`` and ``column``.
Every change is one audit row, actor ``api-token:NAME``, source ``api``.
"""

import json
import time

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from tenants import rules as rule_service
from tenants.errors import NotFound, ServiceError
from tenants.models import Tenant

from .models import ApiToken, hash_token

READ_METHODS = ("GET", "HEAD")


class ApiError(Exception):
    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.extra = status, extra


def _error(status: int, message: str, **extra) -> JsonResponse:
    response = JsonResponse({"error": message, **extra}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="console"'
    return response


def _token(request, read_only: bool) -> ApiToken:
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "a bearer token is required (Authorization: Bearer ...)")
    token = ApiToken.objects.filter(token_hash=hash_token(secret.strip()), revoked=False).first()
    if token is None:
        raise ApiError(401, "unknown or revoked token")
    if not read_only and request.method not in READ_METHODS and token.scope != ApiToken.Scope.WRITE:
        raise ApiError(403, f"token {token.name!r} may only read")
    return token


def _body(request) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except RequestDataTooBig:
        raise ApiError(413, "request body too large") from None
    except ValueError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body is a JSON object")
    return body


def _tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise ApiError(404, f"no tenant {slug!r}")
    return tenant


def endpoint(methods: tuple, read_only: bool = False):
    """Token check, then the view; ApiError / ServiceError as JSON errors.
    ``read_only``: a POST that changes nothing (a read token may make it)."""
    def wrap(view):
        @csrf_exempt
        def handler(request, *args, **kwargs):
            if request.method not in methods:
                response = _error(405, f"{request.method} not allowed here")
                response["Allow"] = ", ".join(methods)
                return response
            try:
                token = _token(request, read_only)
                return view(request, token, *args, **kwargs)
            except ApiError as exc:
                return _error(exc.status, str(exc), **exc.extra)
            except rule_service.RuleStatementError as exc:
                return _error(400, str(exc), line=exc.line, column=exc.column)
            except NotFound as exc:
                return _error(404, str(exc))
            except ServiceError as exc:
                return _error(400, str(exc))
        handler.__name__ = view.__name__
        handler.__doc__ = view.__doc__
        return handler
    return wrap


def _actor(token: ApiToken) -> str:
    return f"api-token:{token.name}"


def _str(body: dict, key: str, required: bool = True, default=None):
    value = body.get(key, default)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{key!r} is a string" + (" (required)" if required else ""))
    return value


# ---------------------------------------------------------------- rules


@endpoint(("GET", "POST"))
def rules(request, token, slug):
    tenant = _tenant(slug)
    if request.method == "GET":
        return JsonResponse({"tenant": tenant.slug, "items": [rule_service.rule_doc(r)
                                                             for r in rule_service.rules(tenant)]})
    body = _body(request)
    unknown = set(body) - {"sql", "action", "config", "enabled"}
    if unknown:
        raise ApiError(400, f"unknown fields: {', '.join(sorted(unknown))}")
    enabled = body.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ApiError(400, "'enabled' is true or false")
    config = body.get("config", {})
    if not isinstance(config, dict):
        raise ApiError(400, "'config' is a JSON object")
    rule = rule_service.add_rule(tenant, sql=_str(body, "sql"), action=_str(body, "action"), config=config,
                                 enabled=enabled, request=request, actor=_actor(token))
    return JsonResponse(rule_service.rule_doc(rule), status=201)


@endpoint(("GET", "DELETE"))
def rule(request, token, slug, rule_id):
    found = rule_service.get_rule(_tenant(slug), rule_id)
    if request.method == "GET":
        return JsonResponse(rule_service.rule_doc(found))
    rule_service.delete_rule(found, request=request, actor=_actor(token))
    return JsonResponse({"deleted": rule_id})


def _set_enabled(request, token, slug, rule_id, enabled: bool):
    found = rule_service.get_rule(_tenant(slug), rule_id)
    if found.enabled != enabled:
        rule_service.set_rule_enabled(found, enabled, request=request, actor=_actor(token))
    return JsonResponse(rule_service.rule_doc(found))


@endpoint(("POST",))
def rule_enable(request, token, slug, rule_id):
    return _set_enabled(request, token, slug, rule_id, True)


@endpoint(("POST",))
def rule_disable(request, token, slug, rule_id):
    return _set_enabled(request, token, slug, rule_id, False)


@endpoint(("POST",), read_only=True)
def rule_test(request, token, slug):
    """A read token may run it (as a tenant's viewers may in the console): nothing is written."""
    tenant = _tenant(slug)
    body = _body(request)
    qos = body.get("qos", 0)
    if qos not in (0, 1, 2) or isinstance(qos, bool):
        raise ApiError(400, "'qos' is 0, 1 or 2")
    client_id = _str(body, "client_id", required=False) or "test-client"
    username = _str(body, "username", required=False)
    row = rule_service.test_rule(_str(body, "sql"), topic=_str(body, "topic"),
                                 payload=_str(body, "payload", default="").encode("utf-8"), client_id=client_id,
                                 username=username if username is not None else f"{tenant.slug}/{client_id}",
                                 qos=qos, timestamp_ms=int(time.time() * 1000),
                                 event_topic=_str(body, "event_topic", default=""),
                                 reason=_str(body, "reason", default=""))
    return JsonResponse({"row": row}, json_dumps_params={"ensure_ascii": False, "default": str})


# ---------------------------------------------------------------- the document


def _op(summary: str, responses: dict, body: str | None = None, params=("tenant",)) -> dict:
    op = {"summary": summary, "security": [{"bearer": []}],
          "parameters": [{"name": p, "in": "path", "required": True,
                          "schema": {"type": "integer" if p == "id" else "string"}} for p in params],
          "responses": {**responses, "400": {"description": "refused: {error[, line, column]}"},
                        "401": {"description": "no, unknown or revoked token"},
                        "403": {"description": "a read token writing"},
                        "404": {"description": "no such tenant or rule"}}}
    if body:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "description": body}}}}
    return op


OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "mqtthub console API", "version": "1",
             "description": "What the console owns: a tenant's rules. Bearer tokens from the console's API tokens "
                            "page (read: GET and rules/test; write: the rest). Errors are {error}."},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "paths": {
        "/api/v1/tenants/{tenant}/rules": {
            "get": _op("the tenant's rules: [{id, sql, action, config, enabled}] (counters: brokerd's "
                       "GET /api/v1/tenants/{tenant}/rules)", {"200": {"description": "{tenant, items}"}}),
            "post": _op("add a rule; validated as manage.py rules add (a malformed statement: 400 with line and "
                        "column); audited; on the nodes within about a second",
                        {"201": {"description": "the rule"}},
                        body="{sql, action: republish|webhook|store, config, enabled?}; config: republish "
                             "{topic, qos?, retain?, payload?, user_properties?}, webhook {url, method?, headers?, "
                             "body?, timeout?, retries?}, store {dataset}")},
        "/api/v1/tenants/{tenant}/rules/{id}": {
            "get": _op("one rule", {"200": {"description": "the rule"}}, params=("tenant", "id")),
            "delete": _op("delete a rule (audited)", {"200": {"description": "{deleted: id}"}},
                          params=("tenant", "id"))},
        "/api/v1/tenants/{tenant}/rules/{id}/enable": {
            "post": _op("enable a rule (audited when it changes)", {"200": {"description": "the rule"}},
                        params=("tenant", "id"))},
        "/api/v1/tenants/{tenant}/rules/{id}/disable": {
            "post": _op("disable a rule (audited when it changes)", {"200": {"description": "the rule"}},
                        params=("tenant", "id"))},
        "/api/v1/tenants/{tenant}/rules/test": {
            "post": _op("run a statement on one message: nothing is stored, published, counted or audited",
                        {"200": {"description": "{row}: the output row, null when WHERE is not true"}},
                        body="{sql, topic, payload (text), client_id?, username?, qos?, event_topic?, reason?}; "
                             "topic $events/NAME: that event, event_topic its message's topic or filter")},
    },
}


@csrf_exempt
def openapi(request):
    if request.method not in READ_METHODS:
        return _error(405, f"{request.method} not allowed here")
    return JsonResponse(OPENAPI)
