"""Logging filters of the console."""

import logging

from django.core.exceptions import PermissionDenied


class PermissionDeniedWithoutTraceback(logging.Filter):
    """A 403 is an answer, not a fault: Django logs "Forbidden (Permission denied): PATH"
    with the exception's whole traceback; keep the line, drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True
