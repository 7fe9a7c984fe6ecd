"""Exit statuses and the known failures that become one line on stderr (no traceback)."""
from __future__ import annotations

import functools
import sys

import click

#: exit statuses (README "Exit statuses"): 0 done; 1 the input, settings or request are wrong (or nothing
#: could be indexed); 2 command-line usage (click); 3 the index or the machine failed (disk full, read-only, I/O)
EXIT_ERROR, EXIT_USAGE, EXIT_STORAGE = 1, 2, 3


def _errors():
    """Known failures become one clear line on stderr and an exit status (no traceback)."""
    from esqbe.errors import BackendError
    from esqbe.ingest.readers import InputError
    from esqbe.query.search import QueryError
    from esqbe.settings.config import ConfigError

    errors = [BackendError, ConfigError, InputError, QueryError, FileNotFoundError, ValueError]
    try:
        from esqbe.encode.identity import DeviceError, ModelNotFoundError

        errors += [ModelNotFoundError, DeviceError]
    except ImportError:
        pass
    return tuple(errors)


def _exit_status(e: BaseException) -> int:
    import sqlite3

    from esqbe.index.api import StorageError

    if isinstance(e, (StorageError, sqlite3.Error)) or (isinstance(e, OSError) and not isinstance(e, FileNotFoundError)):
        return EXIT_STORAGE
    return EXIT_ERROR


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import sqlite3

        try:
            return fn(*args, **kwargs)
        except (*_errors(), sqlite3.Error, OSError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(_exit_status(e))

    return wrapper
