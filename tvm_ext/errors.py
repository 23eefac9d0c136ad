"""User-facing errors: one line, non-zero exit, never a traceback."""


class TvmExtError(Exception):
    """Bad input or an environment that cannot do the job (unknown target, no device...).

    The CLI prints ``error: <message>`` and exits with code 2.
    """
