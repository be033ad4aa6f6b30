"""Base of the tenants app's management commands: argparse subcommands, and
every error as one line ``error: ...`` on stderr with a non-zero exit code."""

import argparse
import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.errors import ServiceError


class OneLineErrorParser(CommandParser):
    """Usage errors as ``error: MESSAGE`` (exit 2) instead of usage + message."""

    def error(self, message):
        if self.called_from_command_line:
            self.exit(2, f"error: {message}\n")
        raise CommandError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


class SubcommandCommand(BaseCommand):
    """Subclasses fill ``add_subcommands`` and define ``do_<name>(**options)``
    per subcommand; ``ServiceError`` becomes the one-line error."""

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineErrorParser  # same class, one-line errors
        return parser

    def add_arguments(self, parser):
        sub = parser.add_subparsers(
            dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=OneLineErrorParser
        )
        self.add_subcommands(sub)

    def add_subcommands(self, sub):
        raise NotImplementedError

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except CommandError as e:
            if not getattr(self, "_called_from_command_line", False) or options.get("traceback"):
                raise
            self.stderr.write(f"error: {e}")
            sys.exit(e.returncode)

    def handle(self, *args, subcommand, **options):
        try:
            getattr(self, "do_" + subcommand.replace("-", "_"))(**options)
        except ServiceError as e:
            raise CommandError(str(e))

    def table(self, header: tuple, rows: list[tuple]):
        """Print rows as left-aligned columns under ``header``."""
        rows = [tuple("" if v is None else str(v) for v in row) for row in [header, *rows]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for row in rows:
            self.stdout.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
