"""User-facing errors: one clear message, no traceback."""


class SchedlabError(Exception):
    """An error the user can fix; the CLI prints its message without a traceback."""
