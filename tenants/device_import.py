"""Devices from a CSV file, and their secrets as one (``manage.py devices import`` and the console's
*Import devices* page): the first line names the columns -- ``name``, and optionally
``cert_fingerprint``, ``cert_cn``, ``description``; the secrets go out as ``name,username,secret``."""

import csv
import io

from .errors import ServiceError

COLUMNS = ("name", "cert_fingerprint", "cert_cn", "description")
MAX_ROWS = 100_000          # devices a console upload may make at once (its body is at most CONSOLE_MAX_BODY)


def parse(source, max_rows: int | None = None) -> list[dict]:
    """The rows of a CSV text stream, checked for shape (each device is checked when it is made);
    ServiceError says what is wrong, with the row counted from 1."""
    try:
        reader = csv.DictReader(source)
        if reader.fieldnames and reader.fieldnames[0].startswith("\ufeff"):
            # the byte order mark Excel's "CSV UTF-8" starts a file with
            reader.fieldnames = [reader.fieldnames[0][1:], *reader.fieldnames[1:]]
        unknown = [c for c in reader.fieldnames or () if c not in COLUMNS]
        if not reader.fieldnames or "name" not in reader.fieldnames or unknown:
            raise ServiceError("the first line names the columns: name (needed), cert_fingerprint, cert_cn, "
                               "description" + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        twice = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1})
        if twice:   # a dict keeps the last: the other column's values would be dropped unsaid
            raise ServiceError(f"the first line names each column once: {', '.join(twice)} twice")
        rows = []
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise ServiceError(f"row {len(rows) + 1}: {len(reader.fieldnames)} columns expected")
            if max_rows is not None and len(rows) >= max_rows:
                raise ServiceError(f"at most {max_rows:,} devices in one file")
            rows.append({k: v.strip() for k, v in row.items()})
    except csv.Error as exc:
        raise ServiceError(f"not a CSV file: {exc}") from None
    except UnicodeDecodeError:
        raise ServiceError("the file is not UTF-8 text") from None
    if not rows:
        raise ServiceError("the file names no device")
    return rows


def write_secrets(target, tenant_slug: str, made) -> None:
    """``name,username,secret`` for each (device, credential, secret) made."""
    writer = csv.writer(target, lineterminator="\n")
    writer.writerow(("name", "username", "secret"))
    for device, _credential, secret in made:
        writer.writerow((device.name, f"{tenant_slug}/{device.name}", secret))


def secrets_text(tenant_slug: str, made) -> str:
    out = io.StringIO()
    write_secrets(out, tenant_slug, made)
    return out.getvalue()
