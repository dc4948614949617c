"""The one exception type for a user's mistake: the CLI prints it on one line and exits with code 2."""


class UserError(Exception):
    """A problem the user can fix (bad config, bad data, missing file). Shown without a traceback."""

    exit_code = 2
