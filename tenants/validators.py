"""Validators shared by the models, the services and the console's forms."""

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator, validate_email

from . import acl

DEVICE_NAME_MAX = 128

SYS_PARTS = ("clients", "messages", "bytes", "subscriptions", "retained", "load")

validate_slug = RegexValidator(
    r"\A[a-z0-9-]{1,63}\Z",
    "A tenant slug is 1-63 characters: lowercase letters, digits and '-'.",
    code="invalid_slug",
)
validate_device_name = RegexValidator(
    rf"\A[a-z0-9_.-]{{1,{DEVICE_NAME_MAX}}}\Z",
    f"A device name is 1-{DEVICE_NAME_MAX} characters: lowercase letters, digits, '-', '_' and '.'.",
    code="invalid_device_name",
)
validate_device_pattern = RegexValidator(
    rf"\A[a-z0-9_.*?\[\]!-]{{1,{DEVICE_NAME_MAX}}}\Z",
    "A device pattern is a glob of device-name characters and * ? [ ] !.",
    code="invalid_device_pattern",
)
validate_fingerprint = RegexValidator(
    r"\A[0-9a-f]{64}\Z",
    "A certificate fingerprint is the SHA-256 of the DER certificate: 64 lowercase hex digits.",
    code="invalid_fingerprint",
)


def validate_email_list(value):
    for email in value:
        try:
            validate_email(email)
        except ValidationError:
            raise ValidationError(f"{email!r} is not a valid email address.", code="invalid_email")


def validate_sys_parts(value):
    unknown = [p for p in value if p not in SYS_PARTS]
    if unknown:
        raise ValidationError(
            f"unknown system-topic part(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(SYS_PARTS)}.",
            code="invalid_parts",
        )


def validate_rule_topic(value):
    error = acl.topic_error(value)
    if error:
        raise ValidationError(error, code="invalid_topic")


def normalize_fingerprint(value: str | None) -> str | None:
    """Lowercase hex without ':' separators (as printed by openssl); None if blank."""
    if value is None:
        return None
    value = value.strip().replace(":", "").lower()
    return value or None
