"""One way to load a model: `Index.encoder` (indexing, query, cite), evaluation, `esqbe tag`'s Python function and the
tagger's own encoder all get their encoder from `esqbe.encode.loader.load_encoder`, counted here with a spy around
the real function (the models really load), and a ModelSpec says which model an index is used with."""
from __future__ import annotations

import json

import pytest

import esqbe
from esqbe.domain import IndexMeta
from esqbe.encode import loader
from esqbe.encode.identity import ModelNotFoundError
from esqbe.encode.loader import ModelSpec, load_encoder
from esqbe.settings.config import Settings

from .conftest import SAMPLE
from .test_evaluate import mini_release  # noqa: F401  (the fixture)


@pytest.fixture
def spy(monkeypatch):
    """Every call of load_encoder (the real one runs), as the specs it was asked for."""
    calls: list[ModelSpec] = []
    real = loader.load_encoder

    def counting(spec, **kw):
        calls.append(spec)
        return real(spec, **kw)

    monkeypatch.setattr(loader, "load_encoder", counting)
    return calls


def test_specs_name_the_model_an_index_is_used_with(tmp_path):
    settings = Settings(batch_size=8, encoder_backend="torch")
    assert ModelSpec.for_index(settings, None) == ModelSpec(None, None, 8, "torch")
    meta = IndexMeta("some-model", 384, "contextual", "sha256:x", str(tmp_path))  # built from a directory
    assert ModelSpec.for_index(settings, meta).model == str(tmp_path)
    assert ModelSpec.for_index(settings.replace(model="other"), meta).model == "other"  # the settings win
    gone = IndexMeta("some-model", 384, "contextual", "sha256:x", str(tmp_path / "gone"))
    with pytest.raises(ModelNotFoundError, match="no longer exists"):
        ModelSpec.for_index(settings, gone)
    assert ModelSpec(backend=None).resolved_backend() == "torch"


def test_equal_specs_share_one_encoder():
    spec = ModelSpec(batch_size=4)
    assert load_encoder(spec) is load_encoder(ModelSpec(batch_size=4))
    assert load_encoder(spec).batch_size == 4


def test_index_query_cite_eval_and_tag_load_through_the_loader(tmp_path, spy, mini_release):  # noqa: F811
    src = tmp_path / "papers.jsonl"
    src.write_text("\n".join(SAMPLE.read_text().splitlines()[:6]) + "\n")
    path = str(tmp_path / "ix")

    with esqbe.open_index(path, config=None, batch_size=8) as index:  # indexing
        assert index.index_files([str(src)], facets="keep").indexed == 6
    assert spy and spy[-1] == ModelSpec(None, None, 8, "auto")  # the default runtime

    n = len(spy)
    with esqbe.open_index(path, config=None, batch_size=8) as index:  # a query by text encodes it
        assert index.query(text="We propose a new method for parsing.", k=2).hits
    assert len(spy) > n

    n = len(spy)
    with esqbe.open_index(path, config=None, batch_size=8) as index:  # cite's token vectors
        pid = json.loads(src.read_text().splitlines()[0])["paper_id"]
        assert index.cite(pid, "a new method").hits
    assert len(spy) > n

    from esqbe.evaluation.evaluate import evaluate_csfcube

    n = len(spy)
    evaluate_csfcube(str(mini_release), Settings(batch_size=8), index_path=str(tmp_path / "eval-ix"),
                     log=lambda msg: None)
    assert len(spy) > n and spy[-1].batch_size == 8

    from esqbe.tagger.files import tag_file

    n = len(spy)
    summary = tag_file(str(src), str(tmp_path / "tagged.jsonl"))  # `esqbe tag`'s function, its own encoder
    assert summary and len(spy) > n and spy[-1].backend == "torch"
