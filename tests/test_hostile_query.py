"""What a query can make esqbe do, attacked the way an attacker would: over HTTP (a real server on loopback and
the app), through the Python API and the CLI. A client must not make the server load a file of its choosing
(word vectors are a pickle), nor hold it with unbounded parameters or text, nor keep its reader busy past
the request's deadline or after it went away; no pattern may take quadratic time on a hostile string.
Every load here is bounded in count and time, every server binds 127.0.0.1."""
from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import esqbe
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions

from .conftest import SAMPLE, LiveServer

RECORDS = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
QID = RECORDS[0]["paper_id"]
REPO = Path(__file__).resolve().parent.parent


class _Touch:
    """Unpickling this creates `path`: what an attacker's vectors.kv would run instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hostile_words(directory: Path) -> Path:
    """A directory that looks like `esqbe train-words` output, whose vectors.kv runs code when unpickled."""
    directory.mkdir(parents=True)
    marker = directory.parent / f"{directory.name}-was-unpickled"
    (directory / "vectors.kv").write_bytes(pickle.dumps(_Touch(marker)))
    (directory / "counts.tsv").write_text("a\t1\n")
    (directory / "words.json").write_text("{}")
    return marker


def _error(r, status: int, match: str = "") -> str:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert match.lower() in message.lower(), message
    assert "Traceback" not in r.text
    return message


@pytest.fixture(scope="module")
def index_path(index_dir_30, tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "index"
    shutil.copytree(index_dir_30, path)
    return path


@pytest.fixture(scope="module")
def words_dir(tmp_path_factory):
    """Real word vectors (`esqbe train-words`) over the sample abstracts: small and quick."""
    from esqbe.rescore.words import train_words

    out = tmp_path_factory.mktemp("words") / "sample"
    train_words([str(SAMPLE)], out, dim=16, min_count=1, epochs=1, workers=1, log=lambda msg: None)
    return out


@pytest.fixture(scope="module")
def client(index_path, encoder, words_dir):
    app = create_app(str(index_path), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", words={"sample": str(words_dir)}))
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.time() + 120
        while c.get("/health").status_code != 200:
            assert time.time() < deadline
            time.sleep(0.1)
        yield c


@pytest.fixture(scope="module")
def direct(index_path, encoder):
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        yield index


# --- item 1: no file a client names is ever loaded ------------------------------------------------------


def test_a_word_vector_directory_from_a_client_is_refused_and_never_unpickled(client, tmp_path, monkeypatch):
    marker = _hostile_words(tmp_path / "evil")
    for words in (str(tmp_path / "evil"), "../evil", "evil/", "/tmp"):
        _error(client.post("/query", json={"paper_id": QID, "rescorer": "asym_token",
                                           "rescorer_params": {"words": words}}), 422, "words")
    # a name that happens to be a directory where the server runs is still only a name
    monkeypatch.chdir(tmp_path)
    _error(client.post("/query", json={"paper_id": QID, "rescorer": "asym_token", "rescorer_params": {"words": "evil"}}),
           400, "no word vectors named 'evil'")
    assert "sample" in _error(client.post("/query", json={"paper_id": QID, "rescorer": "asym_token",
                                                          "rescorer_params": {"words": "evil"}}), 400)
    assert not marker.exists(), "the client's pickle was loaded"


def test_word_vectors_by_the_operators_name(client, direct, words_dir):
    r = client.post("/query", json={"paper_id": QID, "facet": "method", "k": 5, "rescorer": "asym_token",
                                    "rescorer_params": {"words": "sample", "d": 2}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rescorer_params"] == {"words": "sample", "d": 2.0}  # the name; the server's directory stays its own
    expected = direct.query(QID, facet="method", k=5, rescorer="asym_token", rescorer_params={"words": str(words_dir), "d": 2})
    assert [h["paper_id"] for h in body["hits"]] == [h.paper_id for h in expected.hits]


def test_serve_takes_word_vectors_by_name_and_checks_them(index_path, tmp_path):
    from cli import main

    r = CliRunner().invoke(main, ["serve", "--path", str(index_path), "--words", f"acl={tmp_path}"])
    assert r.exit_code != 0 and "holds no word vectors" in r.output
    r = CliRunner().invoke(main, ["serve", "--path", str(index_path), "--words", "acl"])
    assert r.exit_code != 0 and "NAME=DIR" in r.output
    with pytest.raises(ValueError, match="pattern"):
        ServeOptions(words={"../x": str(tmp_path)})


def test_no_request_value_reaches_a_model_or_tagger_loader(client):
    """The settings a request may change are listed; a model, a tagger or an index path is not one of them."""
    for key, value in (("model", "/tmp/evil"), ("tagger", "/tmp/evil.pt"), ("path", "/tmp"), ("settings", {"model": "x"}),
                       ("config", "/tmp/esqbe.yaml")):
        _error(client.post("/query", json={"paper_id": QID, key: value}), 422, key)
    for key in ("model", "tagger", "words_dir", "path"):
        _error(client.post("/query", json={"paper_id": QID, "rescorer": "asym_token", "rescorer_params": {key: "x"}}),
               422, key)
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert set(schema["RescorerParams"]["properties"]) == {"tau", "lam", "exact", "max_iter", "tol", "d", "alpha",
                                                           "max_tokens", "words"}
    assert schema["RescorerParams"]["additionalProperties"] is False


# --- item 2: bounded parameters and text, the same everywhere ---------------------------------------------


@pytest.mark.parametrize("params", [{"max_iter": 10**9}, {"tol": 1e-300}, {"lam": 1e6}, {"tau": 0}, {"max_iter": "many"}])
def test_unbounded_ot_parameters_are_refused_over_http(client, params):
    _error(client.post("/query", json={"paper_id": QID, "facet": "method", "rescorer": "ot", "rescorer_params": params}),
           422, next(iter(params)))


def test_the_schema_shows_the_bounds(client):
    props = client.get("/openapi.json").json()["components"]["schemas"]["RescorerParams"]["properties"]
    from esqbe.rescore.rescorers import rescorer_params

    for p in rescorer_params("ot"):
        if p.low is not None:
            assert (props[p.name]["minimum"], props[p.name]["maximum"]) == (p.low, p.high)


@pytest.mark.parametrize("params, message", [({"max_iter": 10**9}, "max_iter must be between 1 and 2000"),
                                             ({"tol": 1e-300}, "tol must be between"),
                                             ({"lam": 1e6}, "lam must be between")])
def test_the_same_bounds_in_the_python_api_and_the_cli(direct, index_path, params, message):
    with pytest.raises(ValueError, match=message):
        direct.query(QID, facet="method", rescorer="ot", rescorer_params=params)
    key, value = next(iter(params.items()))
    r = subprocess.run([sys.executable, "-m", "cli", "query", "--path", str(index_path), "--paper", QID, "--facet", "method",
                        "--rescorer", "ot", "--param", f"{key}={value}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and message in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_a_config_file_gets_the_same_bounds(index_path, encoder, tmp_path):
    cfg = tmp_path / "esqbe.yaml"
    cfg.write_text("rescorer: ot\nrescorer_params: {max_iter: 1000000000}\n")
    with esqbe.open_index(str(index_path), encoder=encoder, config=str(cfg), create=False) as index:
        with pytest.raises(ValueError, match="max_iter must be between"):
            index.query(QID, facet="method")
    cfg.write_text("facet_settings: {method: {rescorer: ot, rescorer_params: {tol: 1.0e-300}}}\n")
    with esqbe.open_index(str(index_path), encoder=encoder, config=str(cfg), create=False) as index:
        with pytest.raises(ValueError, match="tol must be between"):
            index.query(QID, facet="method")


def test_a_megabyte_query_text_is_refused_before_tokenizing(client, direct):
    from esqbe.query.results import QueryTooLargeError

    one_sentence = "word " * 240_000  # 1.2 MB without a sentence end
    # the schema's bounds (422, before the route runs), then the route's own (413) for what the schema cannot say
    _error(client.post("/query", json={"text": one_sentence}), 422, "at most 100000 characters")
    _error(client.post("/query", json={"text": ["word " * 1_200]}), 422, "at most 5000 characters")
    many = ["Word " * 800 + "."] * 64  # each sentence within its bound, together past the text's
    _error(client.post("/query", json={"text": many}), 413, "characters")
    _error(client.post("/query", json={"text": "word " * 1_200}), 413, "at most 5000 per sentence")
    with pytest.raises(QueryTooLargeError, match="at most 100000"):
        direct.query(text=one_sentence)
    with pytest.raises(QueryTooLargeError, match="per sentence"):
        direct.query(text=["word " * 1_200 + "."])
    assert client.post("/query", json={"text": RECORDS[0]["sentences"], "k": 3}).status_code == 200


def test_the_encoder_never_hands_the_tokenizer_a_megabyte(encoder, monkeypatch):
    from esqbe.core.limits import ENCODE_CHARS_PER_TOKEN
    from esqbe.domain import Paper

    seen = []
    real = encoder.tokenizer

    class Recording:
        def __call__(self, text, *args, **kwargs):
            for t in (text if isinstance(text, list) else [text]) + [a for a in args if isinstance(a, (str, list))]:
                for s in (t if isinstance(t, list) else [t]):
                    seen.append(len(s))
            return real(text, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    from esqbe.encode.encoder import MAX_TITLE_TOKENS

    long, title = "We parse sentences. " + "word " * 200_000, "A title " * 100_000
    short = long[: encoder.max_length * ENCODE_CHARS_PER_TOKEN]
    # as much as the model takes of each gives the same vectors: the cut only drops what it would truncate
    want_ctx = encoder.contextual_sentence_vectors(
        [Paper("p", title[: MAX_TITLE_TOKENS * ENCODE_CHARS_PER_TOKEN], ["Short one.", short])])[0]
    want_ind = encoder.encode_texts([short])
    monkeypatch.setattr(encoder, "tokenizer", Recording())
    got_ctx = encoder.contextual_sentence_vectors([Paper("p", title, ["Short one.", long])])[0]
    got_ind = encoder.encode_texts([long])
    got_tok = encoder.token_vectors([long], max_tokens=100)
    monkeypatch.undo()
    assert max(seen) <= encoder.max_length * ENCODE_CHARS_PER_TOKEN
    assert abs(got_ctx - want_ctx).max() < 1e-5 and abs(got_ind - want_ind).max() < 1e-5
    assert len(got_tok[0][0]) == 100


# --- item 2: deadlines and clients that go away ------------------------------------------------------------

SLOW = {"text": [f"Sentence number {i} describes a method for parsing, tagging and ranking papers." for i in range(64)],
        "rescorer": "asym_token", "rescorer_params": {"max_tokens": 510},
        "first_stage": {"depth": 1000, "knn_k": 1000, "bm25_k": 1000}, "k": 5}
CHEAP = {"paper_id": QID, "facet": "method", "k": 3}


@pytest.fixture(scope="module", autouse=True)
def _no_token_cache(encoder):
    """SLOW is slow because asym_token encodes the tokens of 1,000 candidates' sentences: an encoder that keeps them
    (esqbe.encode.encoder.TOKEN_CACHE_BYTES) would answer it fast from the second run on. None kept in this module."""
    kept = encoder.token_cache_bytes
    encoder.token_cache_bytes = 0
    encoder.forget_token_vectors()
    yield
    encoder.token_cache_bytes = kept


@pytest.fixture(scope="module")
def slow_seconds(direct):
    """How long SLOW takes, uncut, here and now: one run, after a warm-up of two of its sentences (the first query's
    one-off costs; a second full run took as long and doubled the cost). Where the machine is busier now than later,
    the deadlines derived from it are only longer: each test's cut still has to come before SLOW's end."""
    slow = {"rescorer": "asym_token", "rescorer_params": {"max_tokens": 510}, "rescore_depth": 1000, "knn_k": 1000,
            "bm25_k": 1000, "k": 5}
    direct.query(text=SLOW["text"][:2], **slow)
    t0 = time.perf_counter()
    direct.query(text=SLOW["text"], **slow)
    return time.perf_counter() - t0


def test_a_slow_query_is_cut_at_its_deadline_and_the_next_client_is_answered(index_path, encoder, slow_seconds):
    # half of SLOW's time: once it is cut, its reader is freed at its next check, up to one batch of token vectors
    # later (here ~0.4 s of SLOW's ~2.1 s, quiet), and the cheap query must then still fit in what is left of its own
    timeout = slow_seconds / 2
    app = create_app(str(index_path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1", request_timeout=timeout))
    out = {}

    def post(name, body):
        t0 = time.perf_counter()
        out[name] = (httpx.post(url + "/query", json=body, timeout=120), t0, time.perf_counter())

    with LiveServer(app) as url:
        slow = threading.Thread(target=post, args=("slow", SLOW))
        slow.start()
        # late in the slow query's life, so the cheap one (whose deadline runs from its arrival) has most of its
        # own budget left when the slow one is cut: still queued behind it on the single reader
        time.sleep(timeout * 0.8)
        post("cheap", CHEAP)
        slow.join(120)
        service = app.state.service
    r, started, ended = out["slow"]
    _error(r, 504, "request timeout")
    assert ended - started < slow_seconds  # cut, not run to the end
    cheap, _, cheap_done = out["cheap"]
    assert cheap.status_code == 200, cheap.text
    assert cheap_done - started < slow_seconds  # answered before the slow query would have finished
    assert service.timed_out == 1


def test_a_query_past_its_deadline_is_said_the_same_way_whichever_side_sees_it_first(index_path, encoder):
    """The server's wait and the work's own check race at the deadline. Either way the client reads one message:
    the server's request timeout. The loop is held past the deadline in the second run, so that the work's own
    check (at 0.3 s) has failed before the server's wait looks."""
    import asyncio

    from esqbe.core import deadline as deadlines
    from esqbe.core.deadline import Cancelled, Deadline

    def past_it(index):
        time.sleep(0.3)
        deadlines.check()  # as the query's stages do between their steps
        return "finished"

    async def ask(hold_loop: float) -> Cancelled:
        async def hold():
            time.sleep(hold_loop)  # blocks the event loop: its timer cannot fire before the work has failed
        holder = asyncio.ensure_future(hold())
        try:
            await service.read(past_it, deadline=Deadline(0.2))
        except Cancelled as e:
            await holder
            return e
        raise AssertionError("the read was not cut at its deadline")

    app = create_app(str(index_path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))
    service = app.state.service
    try:
        by_the_server = asyncio.run(ask(0.0))
        by_the_work = asyncio.run(ask(0.6))
    finally:
        service.close()
    for e in (by_the_server, by_the_work):
        assert e.timed_out and e.http_status == 504
        assert str(e) == "the query took longer than this server's 0.2 s request timeout and was abandoned"
    assert service.timed_out == 2


def test_a_query_that_waited_past_its_deadline_is_not_started(index_path, encoder, slow_seconds):
    from esqbe.core.deadline import Cancelled, Deadline

    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        gone = Deadline(0.001)
        time.sleep(0.01)
        with pytest.raises(Cancelled, match="deadline"):
            with gone:
                index.query(QID, facet="method")
        with Deadline(slow_seconds / 4), pytest.raises(Cancelled, match="deadline"):  # the Python API gets it too
            index.query(text=SLOW["text"], rescorer="asym_token", rescorer_params={"max_tokens": 510},
                        rescore_depth=1000, knn_k=1000, bm25_k=1000)


def test_a_client_that_goes_away_frees_the_reader(index_path, encoder, slow_seconds):
    app = create_app(str(index_path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1", request_timeout=600))
    with LiveServer(app) as url:
        service = app.state.service
        t0 = time.perf_counter()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/query", json=SLOW, timeout=slow_seconds / 5)  # gives up and closes its connection
        while service.readers[0].pending and time.perf_counter() - t0 < 2 * slow_seconds + 30:
            time.sleep(0.02)
        freed = time.perf_counter() - t0
        assert service.abandoned == 1 and service.readers[0].pending == 0
        assert freed < slow_seconds  # its work stopped, not run to the end
        assert httpx.post(url + "/query", json=CHEAP, timeout=60).status_code == 200


def test_request_timeout_is_an_option_with_bounds():
    assert ServeOptions().request_timeout == 30
    for bad in (0, -1, 10**6):
        with pytest.raises(ValueError):
            ServeOptions(request_timeout=bad)


# --- item 7: linear patterns -------------------------------------------------------------------------------

_PATTERNS = r'''
import sys
from esqbe.evaluation import clscisumm
from esqbe.rescore import asym, words
n = int(sys.argv[1])
units = ["A-", "A ", "A and ", "A et al. ", "(A, 2010", "(A", "(", "(2010, ", "[1, ", "[1-", "<S ", "<S>", "<", "1.",
         "a-", "(e.g., A, 2010; ", " ", " ,", "A (2010, ", "<S a", "</S"]
for u in units:
    s = u * (n // len(u))
    asym.strip_citation_markers(s, narrative=True)
    asym.word_tokens(s)
    list(words._texts_of("x.xml", s.encode()))
    clscisumm.reference_text_parses(s)
print("done")
'''


def test_every_text_pattern_is_linear_on_hostile_strings():
    """200,000 characters of each hostile run through every pattern: linear patterns take well under a second
    each; the quadratic ones took minutes ("A-" * 10000 alone took 13 s)."""
    r = subprocess.run([sys.executable, "-c", _PATTERNS, "200000"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
