"""Exit statuses, and esqbe's own errors as one line on stderr (no traceback); anything else is a bug.

`handle_errors` maps an `EsqbeError` to its message and `exit_status` (docs/faults.md's table, generated
from the classes); a missing file to 1 and the machine's storage failures (OSError, sqlite3.Error) to 3 as
before. Any other exception is not the user's mistake: its traceback is printed and the command exits
`EXIT_INTERNAL` (70), never 1, so a bug is not mistaken for bad input.
"""
from __future__ import annotations

import functools
import sys
import traceback

import click

from esqbe.core.redact import mask_urls
from esqbe.core.textsafe import printable
from esqbe.errors import EXIT_ERROR, EXIT_INTERNAL, EXIT_SIGINT, EXIT_SIGTERM, EXIT_STORAGE, EXIT_USAGE, EsqbeError

from .output import say

__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_SIGINT", "EXIT_SIGTERM", "EXIT_STORAGE", "EXIT_USAGE", "exit_status",
           "handle_errors"]


def exit_status(e: BaseException) -> int:
    """The exit status of a failure: an esqbe error's own; a missing file 1; storage (OSError, sqlite3) 3."""
    import sqlite3

    if isinstance(e, EsqbeError):
        return e.exit_status
    if isinstance(e, FileNotFoundError):
        return EXIT_ERROR
    if isinstance(e, (sqlite3.Error, OSError)):
        return EXIT_STORAGE
    return EXIT_INTERNAL


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import sqlite3

        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:  # `esqbe ... | head`: the reader has all it wants; end quietly, as `cat` does
            _quiet_stdout()
            sys.exit(0)
        except (EsqbeError, sqlite3.Error, OSError) as e:
            # it may quote an id, a file's line or a server's words (controls shown), or a URL (its credentials masked)
            say(f"error: {mask_urls(e)}", err=True)
            sys.exit(exit_status(e))
        except click.exceptions.ClickException as e:
            # a --filter quoted back, a reason quoting data: controls shown (click declares message Final, not frozen)
            e.message = printable(mask_urls(e.message), newlines=True)  # type: ignore[misc]
            raise  # usage errors (2) stay click's
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own exits stay click's
        except Exception as e:  # noqa: BLE001  # a bug: shown as one, with its traceback
            say(mask_urls(traceback.format_exc()), err=True, nl=False)
            say(f"internal error ({type(e).__name__}: {mask_urls(e)}): this is a bug in esqbe, please report it "
                "with the traceback above", err=True)
            sys.exit(EXIT_INTERNAL)

    return wrapper


def _quiet_stdout() -> None:
    """stdout to /dev/null, so that flushing it at exit does not raise into the interpreter's shutdown."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
