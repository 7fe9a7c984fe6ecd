"""esqbe's errors: one hierarchy, each class declaring what it means to the CLI (`exit_status`) and to the
server (`http_status`, `retry_after`). Only these are reported as the user's mistake or the machine's
failure; any other exception out of the library is a bug (the CLI prints a traceback and exits
`EXIT_INTERNAL`, the server answers 500 with a request id).

The classes of the modules that raise them stay defined (and importable) there, deriving from the bases
here; `error_classes()` walks them all (docs/faults.md's exit-status table is generated from it). Classes that were
a `ValueError` before the hierarchy keep `ValueError` as a second base, so callers catching it keep working.
"""
from __future__ import annotations

from typing import Any, ClassVar

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_STORAGE, EXIT_INTERNAL = 0, 1, 2, 3, 70
EXIT_SERVER = 4  # `esqbe query --server URL`: that server did not answer
EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # `esqbe index` interrupted: 128 + the signal's number, as shells report it

#: what each exit status means (docs/faults.md's table is generated from it)
EXIT_MEANINGS = {
    EXIT_OK: "done (bad lines, if any, were reported as warnings and the rest indexed)",
    EXIT_ERROR: "the input, a setting or the request is wrong: bad config value, unknown paper, model mismatch, "
                "`--strict` stopped at a bad line, or records were read but none could be indexed",
    EXIT_USAGE: "command-line usage: unknown option, a value out of its range (`-k 0`, `--bm25-weight 5`)",
    EXIT_STORAGE: "the index or the machine failed: disk full, read-only index, I/O error (what was committed "
                  "before it stays)",
    EXIT_SERVER: "`esqbe query --server URL`: that server cannot be reached, timed out, failed (5xx), redirected "
                 "or answered something that is not a query result; a server the query found by itself falls back "
                 "to answering locally instead",
    EXIT_SIGINT: "`esqbe index` interrupted by SIGINT (Ctrl-C): the batch being written was finished or rolled back, "
                 "and the summary says what is committed and searchable; the same command again indexes the rest. "
                 "`esqbe adapt` (SIGINT or SIGTERM): its message says what was kept, nothing or the last complete epoch",
    EXIT_SIGTERM: "`esqbe index` stopped by SIGTERM: as for SIGINT",
    EXIT_INTERNAL: "an internal error, a bug in esqbe: the traceback is printed; please report it",
}


class EsqbeError(Exception):
    """An error esqbe reports as such: a message, its exit status and its HTTP status. `report` is what a run
    had done before it stopped (an IndexReport), when there was a run; `details` a list for the JSON body."""

    exit_status: ClassVar[int] = EXIT_ERROR
    http_status: ClassVar[int] = 400
    retry_after: ClassVar[int | None] = None  # seconds, the HTTP Retry-After header of a 503

    def __init__(self, message: str = "", *args: Any, report: Any = None, details: list | None = None):
        super().__init__(message, *args)
        self.report = report
        self.details = details

    def with_report(self, report: Any) -> EsqbeError:
        """This error, carrying `report` (a run that stops re-raises the error it met with what it had done)."""
        self.report = report
        return self


class UserError(EsqbeError):
    """The request, the input or the settings are wrong: the user can fix it."""


class ParameterError(UserError, ValueError):
    """A parameter or option given to a call is not one it takes (a rescorer's parameter, a fusion method,
    a facet mode, an input format, cite's options, a shard): the message names it and what it takes."""


class DataError(UserError, ValueError):
    """A data file (an evaluation collection, a run file, a corpus) is missing or malformed."""


class ModelError(UserError):
    """The model, encoder backend, device or tagger asked for cannot be used here."""


class BackendError(EsqbeError, RuntimeError):
    """A backend cannot do what was asked (unreachable engine, missing index, bad state)."""

    http_status: ClassVar[int] = 503
    retry_after: ClassVar[int | None] = 5


class StorageError(BackendError):
    """The index cannot be read or written (disk full, read-only, I/O error); `.report` says what a run
    had committed before it (an IndexReport), when there was a run."""

    exit_status: ClassVar[int] = EXIT_STORAGE


class ModelMismatchError(BackendError, ModelError):
    """The index was built with another encoder than the one asked to query or extend it."""

    http_status: ClassVar[int] = 409
    retry_after: ClassVar[int | None] = None


def error_classes() -> list[type[EsqbeError]]:
    """Every EsqbeError class of esqbe (its modules imported), the base first, then by module and name."""
    import importlib

    for module in _DEFINING_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:  # an optional dependency missing: its classes are not there to list
            pass
    seen: list[type[EsqbeError]] = []

    def walk(cls: type[EsqbeError]) -> None:
        for sub in cls.__subclasses__():
            if sub not in seen and sub.__module__.startswith("esqbe.") and not sub.__name__.startswith("_"):
                seen.append(sub)
                walk(sub)

    walk(EsqbeError)
    return [EsqbeError, *sorted(seen, key=lambda c: (c.__module__ != __name__, c.__module__, c.__name__))]


#: the modules that define EsqbeError subclasses (error_classes imports them to find every class)
_DEFINING_MODULES = (
    "esqbe.backends.base", "esqbe.core.deadline", "esqbe.core.filters", "esqbe.distributed.raydata", "esqbe.encode.identity",
    "esqbe.encode.modeldir", "esqbe.encode.adapter", "esqbe.encode.distill", "esqbe.encode.citations",
    "esqbe.evaluation.clscisumm_data", "esqbe.evaluation.csfcube", "esqbe.ingest.readers", "esqbe.query.results",
    "esqbe.rescore.words", "esqbe.settings.config", "esqbe.tagger.net", "esqbe.server.client", "esqbe.index.watches",
    "esqbe.ingest.web", "esqbe.index.follow",
)


#: where the table is, and its markers there
PAGE = "docs/faults.md"
TABLE_BEGIN, TABLE_END = f"<!-- errors table: generated from esqbe/errors.py (python -m esqbe.errors {PAGE}) -->", \
    "<!-- end of errors table -->"


def markdown_table() -> str:
    """The exit statuses and the status of each error class, as markdown (docs/faults.md)."""
    lines = ["| exit status | meaning |", "|---|---|"]
    lines += [f"| {status} | {meaning} |" for status, meaning in EXIT_MEANINGS.items()]
    lines += ["", "Each of esqbe's errors (`esqbe.errors.EsqbeError` and its subclasses, importable from the module "
              "named) declares its exit status and its HTTP status; anything else is a bug (exit 70, HTTP 500).", "",
              "| error | module | exit | HTTP | meaning |", "|---|---|---|---|---|"]
    for cls in error_classes():
        http = f"{cls.http_status}" + (f" (Retry-After {cls.retry_after} s)" if cls.retry_after else "")
        if cls.__name__ == "Cancelled":
            http = "504 (timed out), 503 (cancelled)"
        doc = " ".join((cls.__doc__ or "").split()).split(". ")[0].rstrip(".")
        lines.append(f"| `{cls.__name__}` | `{cls.__module__}` | {cls.exit_status} | {http} | {doc} |")
    return "\n".join(lines)


def render_page(text: str) -> str:
    """`text` (docs/faults.md) with the table between its markers regenerated."""
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_BEGIN}\n{markdown_table()}\n{TABLE_END}{tail}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    # the module itself, not this __main__ copy (its classes are the ones subclassed)
    from esqbe import errors

    path = Path(sys.argv[1] if len(sys.argv) > 1 else PAGE)
    text = path.read_text(encoding="utf-8")
    if errors.TABLE_BEGIN not in text or errors.TABLE_END not in text:
        sys.exit(f"{path} has no errors table's markers: the table is in {PAGE}")
    path.write_text(errors.render_page(text), encoding="utf-8")
