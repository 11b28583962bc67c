"""Errors the CLI turns into one clear line and an exit code (never a traceback)."""


class BertfuseError(Exception):
    """Bad input from the user: missing/corrupt files, mismatched config, unknown names."""

    exit_code = 2


class UsageError(BertfuseError):
    """Bad command-line arguments (argparse's errors, reported as one line)."""


class ParityError(BertfuseError):
    """The converted model drifts from the source model past tolerance."""

    exit_code = 1

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report  # the run so far, so the CLI can show the parity table


class FusionIncomplete(BertfuseError):
    """--strict and at least one layer was left unfused."""

    exit_code = 1
