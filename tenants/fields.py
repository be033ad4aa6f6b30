"""Model fields of the tenants app."""

from django.db import models


class LineListField(models.TextField):
    """A list of strings stored as text, one per line (items hold no newline)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("default", list)
        kwargs.setdefault("blank", True)
        super().__init__(*args, **kwargs)

    @staticmethod
    def _split(text: str) -> list[str]:
        return [line for line in text.split("\n") if line]

    def from_db_value(self, value, expression, connection):
        return None if value is None else self._split(value)

    def to_python(self, value):
        if value is None or isinstance(value, list):
            return value
        if isinstance(value, tuple):
            return list(value)
        return self._split(str(value))

    def get_prep_value(self, value):
        if value is None:
            return None
        if isinstance(value, str):
            return value
        return "\n".join(value)

    def value_to_string(self, obj):
        return self.get_prep_value(self.value_from_object(obj))
