"""The one exception type users see: a clean message, never a traceback."""


class UserError(Exception):
    """Bad input from the user (scenario, CLI flag, missing file).

    The CLI prints ``error: <message>`` and exits with code 2. The message must say
    where the problem is (file, key path) and how to fix it.
    """
