"""What the rest of brokerd needs to know of rules without loading the
compiler (and sqlglot with it: about 17 MB of a node's memory, paid only
when a tenant of the node has a rule)."""

EVENTS = ("client_connected", "client_disconnected", "session_subscribed", "session_unsubscribed", "message_dropped",
          "delivery_dropped", "message_acked", "client_check_authz_complete")
EVENT_PREFIX = "$events/"


class RuleSyntaxError(ValueError):
    """A statement that cannot be compiled; ``line`` and ``column`` count from 1."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.message, self.line, self.column = message, line, column
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(where + message)


class RuleEvalError(Exception):
    """A rule failed on one message (a type mismatch, a function's error)."""
