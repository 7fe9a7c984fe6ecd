"""One error hierarchy: every esqbe error declares its exit and HTTP status, docs/faults.md's table is
generated from the classes, and only esqbe's own errors are reported as the user's: a plain ValueError out
of the library is a bug (the CLI prints its traceback and exits 70, not 1; the server answers 500, not 400)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from cli import main
from esqbe.errors import (
    EXIT_INTERNAL,
    EXIT_MEANINGS,
    BackendError,
    EsqbeError,
    ParameterError,
    StorageError,
    error_classes,
    render_page,
)
from esqbe.index.api import Index
from esqbe.query.results import PaperNotFoundError, QueryError

FAULTS = Path(__file__).resolve().parents[1] / "docs" / "faults.md"


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_error_class_declares_its_statuses():
    classes = error_classes()
    assert set(_all_subclasses(EsqbeError)) >= set(classes[1:])
    names = {c.__name__ for c in classes}
    for expected in ("BackendError", "StorageError", "ModelMismatchError", "WriteLockBusy", "ConfigError", "InputError",
                     "FilterError", "QueryError", "PaperNotFoundError", "EmptyIndexError", "QueryTooLargeError",
                     "ModelNotFoundError", "DeviceError", "EncoderBackendError", "TaggerMismatchError", "WordsError",
                     "CSFCubeDataError", "CSFCubeMissingFile", "ClScisummDataError", "Cancelled", "ParameterError"):
        assert expected in names, expected
    for cls in classes:
        assert isinstance(cls.exit_status, int) and cls.exit_status in EXIT_MEANINGS and cls.exit_status not in (0, 2, 70)
        assert isinstance(cls.http_status, int) and 400 <= cls.http_status < 600, cls
        assert cls.retry_after is None or (isinstance(cls.retry_after, int) and cls.http_status == 503), cls
    by_name = {c.__name__: c for c in classes}
    assert (by_name["StorageError"].exit_status, by_name["StorageError"].http_status) == (3, 503)
    assert by_name["PaperNotFoundError"].http_status == 404
    assert by_name["EmptyIndexError"].http_status == 409
    assert by_name["ModelMismatchError"].http_status == 409
    assert by_name["QueryTooLargeError"].http_status == 413
    assert by_name["BackendError"].retry_after == 5


def test_old_bases_kept_and_report_is_a_constructor_field():
    import esqbe.settings.config as config_module
    from esqbe.core.filters import FilterError
    from esqbe.ingest.readers import InputError

    for cls in (config_module.ConfigError, FilterError, InputError, QueryError, ParameterError):
        assert issubclass(cls, ValueError) and issubclass(cls, EsqbeError)
    assert issubclass(StorageError, RuntimeError) and issubclass(StorageError, BackendError)
    e = StorageError("disk full", report="the report", details=["x"])
    assert (e.report, e.details, str(e)) == ("the report", ["x"], "disk full")
    assert InputError("f.jsonl", 3, "title", "missing").report is None


def test_the_faults_page_table_matches_the_classes():
    text = FAULTS.read_text(encoding="utf-8")
    assert render_page(text) == text, "docs/faults.md's errors table is stale: run `python -m esqbe.errors docs/faults.md`"


# --- the CLI ------------------------------------------------------------------------------------------------
def _stats(path, monkeypatch, exc):
    """`esqbe stats` on a real index whose Index.stats raises `exc`."""
    def boom(self):
        raise exc

    monkeypatch.setattr(Index, "stats", boom)
    return CliRunner().invoke(main, ["stats", "--path", str(path)], catch_exceptions=False)


def _text(r) -> str:
    try:
        return r.output + r.stderr
    except ValueError:  # an older click mixes stderr into output
        return r.output


def test_cli_a_bug_is_a_traceback_and_the_internal_status(index_dir_30, monkeypatch):
    r = _stats(index_dir_30, monkeypatch, ValueError("bug"))
    assert r.exit_code == EXIT_INTERNAL != 1, _text(r)
    assert "Traceback" in _text(r) and "ValueError: bug" in _text(r)
    assert "please report" in _text(r)


@pytest.mark.parametrize("exc, status", [(ParameterError("bad value"), 1), (QueryError("bad query"), 1),
                                         (StorageError("disk full"), 3), (BackendError("engine down"), 1)])
def test_cli_esqbe_errors_are_one_line_and_their_status(index_dir_30, monkeypatch, exc, status):
    r = _stats(index_dir_30, monkeypatch, exc)
    assert r.exit_code == status
    assert f"error: {exc}" in _text(r) and "Traceback" not in _text(r)


# --- the server ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(index_dir_30, encoder, tmp_path_factory):
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    path = tmp_path_factory.mktemp("errors") / "index"
    shutil.copytree(index_dir_30, path)
    app = create_app(str(path), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.time() + 120
        while c.get("/health").status_code != 200 and time.time() < deadline:
            time.sleep(0.2)
        yield c


@pytest.mark.parametrize("exc, status", [(ValueError("bug"), 500), (KeyError("bug"), 500), (QueryError("no"), 400),
                                         (PaperNotFoundError("gone"), 404), (BackendError("engine down"), 503)])
def test_server_maps_only_esqbe_errors(client, monkeypatch, exc, status):
    def boom(self):
        raise exc

    monkeypatch.setattr(Index, "stats", boom)
    r = client.get("/stats")
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    if status == 500:
        assert "internal error" in message and "bug" not in message
    else:
        assert str(exc) in message
    assert (r.headers.get("retry-after") == "5") == (status == 503)
