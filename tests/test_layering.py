"""What each part of the project may import, checked on the source with ``ast``.

Every import counts: at the top of a module and inside a function alike (an
import inside a function still runs; it only hides the dependency). The
Django apps stand in floors:

    console         the project (settings, URLs, ASGI) and the staff UI: may import everything
    tenants  metrics  spark_reports     import core (and each other as they need), never console
    core            the ground floor: imports no other app of the project

``RULES`` is the table: ``(package, forbidden, why)`` -- no module under
``package`` imports a module under any of ``forbidden`` (project packages or
any other top-level name, e.g. ``asyncio`` or ``django``). To add a rule,
add a row; to check another package (brokerd), add it to ``SCANNED``.
``test_no_import_cycles`` finds circles among the modules of ``ACYCLIC``;
``LAZY`` lists the imports between project modules made inside functions,
each with its reason (none of them may exist to break a circle).

brokerd has its own layers (DESIGN.md, README *How it is built*): the
protocol core is sans-IO -- no asyncio, no clock, no sockets, no storage --
and so are the session, the router and the broker; only ``transports``,
``cluster``, ``admin``, ``store``, ``integrations`` and ``server`` do I/O; nothing in brokerd
imports Django or the console's apps (it reads the console's tables with
plain SQL, ``tenancy/source.py``).

Templates stand in the same floors (``templates/<app>/``): an app's templates
include, extend and load tag libraries only from the apps its code may import.
"""

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DJANGO_APPS = ("core", "tenants", "metrics", "spark_reports", "console")
SCANNED = DJANGO_APPS + ("brokerd",)
ACYCLIC = DJANGO_APPS + ("brokerd",)

# what brokerd's pure layers may not reach: I/O, the clock, and the layers that do I/O
IO = ("asyncio", "uvloop", "socket", "ssl", "selectors", "time", "sqlite3", "happybase", "redis", "psycopg", "h11",
      "wsproto", "brokerd.transports", "brokerd.cluster", "brokerd.admin", "brokerd.store", "brokerd.server",
      "brokerd.persistence", "brokerd.integrations")
DJANGO_SIDE = ("django", "channels", "celery", "console", "core", "tenants", "metrics", "spark_reports")


@dataclass(frozen=True)
class Rule:
    package: str
    forbidden: tuple[str, ...]
    why: str


RULES = [
    Rule("core", ("console", "tenants", "metrics", "spark_reports", "brokerd"),
         "the ground floor: every app builds on it, so it may build on none of them"),
    Rule("tenants", ("console",), "console is the top floor"),
    Rule("metrics", ("console",), "console is the top floor"),
    Rule("spark_reports", ("console",), "console is the top floor"),
    Rule("brokerd", DJANGO_SIDE, "brokerd reaches the console only through its tables and the admin API"),
    Rule("brokerd.protocol", IO + ("brokerd.broker", "brokerd.registry", "brokerd.routing", "brokerd.tenancy"),
         "the protocol core is sans-IO, and talks to the broker only through ports.ChannelBroker"),
    Rule("brokerd.session", IO, "session state is pure"),
    Rule("brokerd.routing", IO, "the router is pure"),
    Rule("brokerd.broker", IO, "the broker is pure: now comes from the caller"),
    Rule("brokerd.registry", IO, "the client registry is pure: timers are a heap served by tick(now)"),
    Rule("brokerd.budget", IO, "the budgets' policy is pure: the timer is given"),
    Rule("brokerd.delayed", IO, "delayed publish's broker side is pure: the store and the clock are the runner's "
         "(brokerd.store.delayed)"),
    Rule("brokerd.tenancy.enforcement", IO, "enforcement is pure"),
    Rule("brokerd.tenancy.acl", IO, "the ACL engine is pure (the console runs it too)"),
    Rule("brokerd.metrics.accounting", IO, "counting is pure"),
    Rule("brokerd.rules", IO + ("brokerd.broker", "brokerd.registry", "brokerd.tenancy"),
         "the rule engine is pure (the console compiles rules with it too): the broker is handed in"),
    Rule("brokerd.metrics.counters", IO, "counters are pure (the console reads DROP_REASONS)"),
    Rule("brokerd.integrations", ("brokerd.broker", "brokerd.registry", "brokerd.routing", "brokerd.session",
                                  "brokerd.protocol", "brokerd.tenancy", "brokerd.rules", "brokerd.server"),
         "the senders of rules' actions get rendered requests and the rule's counters; they reach nothing of the "
         "broker (server.py wires them)"),
]

# (importer, imported) -> why the import is made inside a function
LAZY = {
    ("metrics.apps", "metrics.signals"): "Django's AppConfig.ready: the receivers import models, loaded once the apps are",
    ("spark_reports.reports", "core.roles"): "the report registry is imported without Django (bench/reports_1m.py)",
    ("spark_reports.reports", "tenants.access"): "the report registry is imported without Django (bench/reports_1m.py)",
    ("spark_reports.telemetry", "core.roles"): "a report is imported without Django, as spark_reports.reports",
    ("spark_reports.telemetry", "tenants.access"): "a report is imported without Django, as spark_reports.reports",
    ("brokerd.store", "brokerd.store.memory"): "a store backend (and its library) is imported only when it is used",
    ("brokerd.store", "brokerd.store.sqlite"): "a store backend (and its library) is imported only when it is used",
    ("brokerd.store", "brokerd.store.hbase"): "a store backend (and its library) is imported only when it is used",
    ("brokerd.rules.engine", "brokerd.rules.compiler"):
        "the rule compiler imports sqlglot (~17 MB): loaded only on a node whose tenants have rules",
    ("spark_reports.delivery", "spark_reports.mailchart"):
        "the emailed chart imports matplotlib (~1 s, ~60 MiB): loaded by the worker that sends, not by every "
        "console process (the pages import delivery to say where email goes)",
    ("brokerd.server", "brokerd.cluster.bus"):
        "the cluster imports redis-py (~8 MB of RSS): loaded only by a node started with --cluster",
    ("brokerd.server", "brokerd.cluster.node"):
        "the cluster imports redis-py (~8 MB of RSS): loaded only by a node started with --cluster",
    ("brokerd.server", "brokerd.cluster.peers"):
        "the cluster imports redis-py (~8 MB of RSS): loaded only by a node started with --cluster",
    ("brokerd.server", "brokerd.cluster.purge"):
        "the cluster imports redis-py (~8 MB of RSS): loaded only by a node started with --cluster",
    ("brokerd.admin.endpoints", "brokerd.metrics.prometheus"):
        "prometheus_client is imported with the first /metrics request, not by every node at start",
}


@dataclass(frozen=True)
class Import:
    importer: str       # the module that imports
    imported: str       # the module imported (the most specific one that exists), or a top-level name
    line: int
    lazy: bool          # inside a function


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _resolve(importer: str, is_package: bool, module: str | None, level: int) -> str:
    if not level:
        return module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[:len(package) - level + 1]
    return ".".join(base + ([module] if module else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, importer: str, is_package: bool):
        self.importer, self.is_package = importer, is_package
        self.depth = 0
        self.found: list[Import] = []

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, name: str, line: int):
        self.found.append(Import(self.importer, name, line, self.depth > 0))

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        base = _resolve(self.importer, self.is_package, node.module, node.level)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self._add(sub if _is_module(sub) else base, node.lineno)


def project_modules(packages=SCANNED) -> Iterator[tuple[str, Path]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield _module_name(path), path


def imports(packages=SCANNED) -> list[Import]:
    out = []
    for name, path in project_modules(packages):
        collector = _Collector(name, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text(), str(path)))
        out.extend(collector.found)
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _where(i: Import) -> str:
    return f"{i.importer} (line {i.line}{', inside a function' if i.lazy else ''}) imports {i.imported}"


@pytest.fixture(scope="module")
def all_imports() -> list[Import]:
    return imports()


def test_the_scan_sees_imports(all_imports):
    """A scan that found nothing would pass every rule."""
    seen = {(i.importer, i.imported) for i in all_imports}
    assert ("tenants.views", "core.shortcuts") in seen and ("console.urls", "tenants.views") in seen
    assert ("spark_reports.tasks", "spark_reports.services") in seen        # from . import services
    assert ("core.views", "core.shortcuts") in seen                         # from .shortcuts import ...
    assert ("spark_reports.reports", "core.roles", True) in {(i.importer, i.imported, i.lazy) for i in all_imports}
    assert ("brokerd.protocol.channel", "brokerd.protocol.ports") in seen               # from .ports import ...
    assert ("brokerd.broker", "brokerd.routing.router") in seen
    assert ("brokerd.transports.connection", "asyncio") in seen


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.package)
def test_forbidden_imports(rule, all_imports):
    wrong = sorted({_where(i) for i in all_imports
                    if _under(i.importer, rule.package) and any(_under(i.imported, f) for f in rule.forbidden)})
    assert not wrong, f"{rule.package} may not import {', '.join(rule.forbidden)} ({rule.why}):\n" + "\n".join(wrong)


def _graph(found: list[Import], packages) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name, _ in project_modules(packages)}
    for i in found:
        if i.importer in graph and i.imported in graph and i.imported != i.importer:
            graph[i.importer].add(i.imported)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles(all_imports):
    cycles = _cycles(_graph(all_imports, ACYCLIC))
    assert not cycles, "modules that import each other (also through imports inside functions):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_imports_inside_functions_are_the_known_ones(all_imports):
    project = tuple(SCANNED)
    lazy = {(i.importer, i.imported) for i in all_imports
            if i.lazy and any(_under(i.imported, p) for p in project)}
    assert lazy == set(LAZY), ("an import between project modules inside a function hides a dependency: "
                               f"move it to the top, or say in LAZY why it cannot be\nnew: {lazy - set(LAZY)}\n"
                               f"gone: {set(LAZY) - lazy}")


# ---------------------------------------------------------------- templates

TEMPLATES = ROOT / "templates"
_TAG = re.compile(r"{%\s*(include|extends)\s+[\"']([^\"']+)[\"']|{%\s*load\s+([^%]+?)\s*%}")


def _tag_libraries() -> dict[str, str]:
    """Template tag library -> the app that defines it."""
    return {path.stem: app for app in DJANGO_APPS for path in (ROOT / app / "templatetags").glob("*.py")
            if path.stem != "__init__"}


def _template_uses() -> Iterator[tuple[str, str, str]]:
    """(template, app it uses, what) for every include, extends and load of an app's templates."""
    libraries = _tag_libraries()
    for app in DJANGO_APPS:
        for path in sorted((TEMPLATES / app).rglob("*.html")) + sorted((TEMPLATES / app).rglob("*.txt")):
            name = str(path.relative_to(TEMPLATES))
            for m in _TAG.finditer(path.read_text()):
                if m.group(2):
                    target = m.group(2).split("/")[0]
                    if target in DJANGO_APPS:
                        yield name, target, f"{m.group(1)} {m.group(2)}"
                else:
                    for library in m.group(3).split():
                        if library in libraries:
                            yield name, libraries[library], f"load {library}"


def test_the_template_scan_sees_uses():
    uses = set(_template_uses())
    assert ("tenants/members.html", "core", "include core/partials/field.html") in uses
    assert ("metrics/cluster.html", "metrics", "load metrics_tags") in uses


@pytest.mark.parametrize("rule", [r for r in RULES if r.package in DJANGO_APPS], ids=lambda r: r.package)
def test_templates_follow_the_same_floors(rule):
    wrong = [f"{template}: {what}" for template, app, what in _template_uses()
             if template.split("/")[0] == rule.package and app in rule.forbidden]
    assert not wrong, f"templates/{rule.package}/ may not use {', '.join(rule.forbidden)}:\n" + "\n".join(wrong)
