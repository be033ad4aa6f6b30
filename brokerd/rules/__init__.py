"""A tenant's rules: SQL-like statements over its messages and client events.

EMQX's rule language (``SELECT ... FROM "topic/filter" WHERE ...``), parsed by
sqlglot and compiled once per rule into Python closures (``compiler``); the
functions a statement may call (``functions``); ``${field}`` templates
(``template``); what a rule sees of a message or an event (``context``); the
actions (``actions``) and the per-tenant table the broker consults once per
PUBLISH (``engine``).

Pure, like the broker: no asyncio, no clock, no storage -- the time of a
message is passed in. The console runs ``compiler`` too (validation and
``manage.py rules test``), as it runs ``tenancy.acl``.
"""

from .context import Context
from .errors import EVENTS, RuleEvalError, RuleSyntaxError

# compile_rule lives in .compiler, which imports sqlglot: imported by whoever compiles, not here
__all__ = ["EVENTS", "Context", "RuleEvalError", "RuleSyntaxError"]
