"""Metadata filters: the grammar, its meaning against a brute-force reference, the engine translation
against the same meaning, and pre-filtered first stages on a real embedded index."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esqbe.backends.embedded.backend import EmbeddedBackend
from esqbe.core.filters import (
    OPERATORS,
    Condition,
    FilterError,
    MetadataColumns,
    MetadataFilter,
    coerce_filters,
    condition_dsl,
    condition_matches,
    flatten_for_engine,
    parse_filter,
    to_query_dsl,
)
from esqbe.domain import FirstStageRequest, IndexedPaper, IndexMeta, Paper

# ------------------------------------------------------------------------------------------ grammar


@pytest.mark.parametrize("text, expected", [
    ("year>=2019", Condition("year", ">=", "2019")),
    ("year >= 2019", Condition("year", ">=", "2019")),
    ("year<2019", Condition("year", "<", "2019")),
    ("year<=2019", Condition("year", "<=", "2019")),
    ("year>2019", Condition("year", ">", "2019")),
    ("venue=ACL", Condition("venue", "=", "ACL")),
    ("venue==ACL", Condition("venue", "=", "ACL")),
    ("venue = Nature Communications", Condition("venue", "=", "Nature Communications")),
    ('author!="Doe, Jane"', Condition("author", "!=", "Doe, Jane")),
    ("author!='O\\'Brien'", Condition("author", "!=", "O'Brien")),
    ("venue in (ACL, EMNLP)", Condition("venue", "in", ("ACL", "EMNLP"))),
    ("venue IN (ACL)", Condition("venue", "in", ("ACL",))),
    ('venue not in (ACL, "A, B (2)")', Condition("venue", "not in", ("ACL", "A, B (2)"))),
    ("external_ids.doi exists", Condition("external_ids.doi", "exists")),
    ("exists external_ids.doi", Condition("external_ids.doi", "exists")),
    ("doi not exists", Condition("doi", "not exists")),
    ("not exists doi", Condition("doi", "not exists")),
])
def test_grammar_reads_every_operator(text, expected):
    c = parse_filter(text)
    assert c == expected
    assert parse_filter(str(c)) == c  # printing gives back a filter that reads the same
    assert Condition.from_dict(json.loads(json.dumps(c.to_dict()))) == c  # JSON round trip


def test_every_operator_has_a_grammar_example():
    seen = {parse_filter(t).op for t in ["a=1", "a!=1", "a<1", "a<=1", "a>1", "a>=1", "a in (1)", "a not in (1)",
                                         "a exists", "a not exists", "a~=x", "a^=x"]}
    assert seen == set(OPERATORS)


@pytest.mark.parametrize("text, column, reason", [
    ("", None, "empty filter"),
    ("year 2019", 6, "expected an operator after 'year'"),
    ("year >=", 8, "expected a value"),
    ("year => 2019", 7, "unexpected '>' after operator '='"),
    ("venue in ACL", 10, "expected '(' after 'in'"),
    ("venue in (ACL", 14, "missing ')'"),
    ("venue in (ACL) x", 16, "unexpected text after ')'"),
    ('venue="ACL', 7, "unterminated"),
    ('venue="ACL" x', 13, "unexpected text after the value"),
    ("2019<=year", 1, "expected a metadata key"),
    ("doi exists now", 12, "'exists' takes no value"),
    ("year>=20 15", 10, "unexpected '15' after the value '20' (a number is one word"),  # not the text "20 15"
    ("year in (2019 2020)", 15, "unexpected '2020' after the value '2019'"),
    ("venue > ACL 2019", 13, "unexpected '2019' after the value 'ACL' ('>' compares with one word"),
])
def test_bad_filters_say_where_and_what(text, column, reason):
    with pytest.raises(FilterError) as e:
        parse_filter(text)
    msg = str(e.value)
    assert reason in msg
    if column is not None:
        assert f"column {column}:" in msg
    assert "year>=2019" in msg  # every message teaches the syntax


def test_a_bare_text_value_may_hold_spaces_where_it_can_only_be_text():
    assert parse_filter("collection=Chapter 2: Methods").value == "Chapter 2: Methods"
    assert parse_filter("venue in (ACL 2019, EMNLP)").value == ("ACL 2019", "EMNLP")
    assert parse_filter('year>="20 15"').value == "20 15"  # quoted: the text, as asked


@pytest.mark.parametrize("bad, reason", [
    ({"key": "year", "op": "~", "value": 1}, "unknown operator '~'"),
    ({"key": "year", "op": "in", "value": 2019}, "expected a list of values"),
    ({"key": "year", "op": "in", "value": []}, "the list is empty"),
    ({"key": "year", "op": "=", "value": None}, "expected a string, number or boolean"),
    ({"key": "year", "op": "=", "value": {"a": 1}}, "expected a string, number or boolean"),
    ({"key": "year", "op": "exists", "value": 1}, "takes no value"),
    ({"key": "year"}, "needs 'key' and 'op'"),
    ({"key": "year", "op": "=", "value": 1, "extra": 2}, "unknown field(s) extra"),
    ({"key": "bad key", "op": "=", "value": 1}, "is not a metadata key"),
    (42, "a filter is a string or"),
])
def test_structured_filters_are_checked(bad, reason):
    with pytest.raises(FilterError) as e:
        coerce_filters([bad])
    assert reason in str(e.value)


def test_structured_forms_agree():
    as_text = coerce_filters(["year>=2019", "venue in (ACL, EMNLP)"])
    as_dicts = coerce_filters([{"key": "year", "op": ">=", "value": 2019}, {"key": "venue", "op": "in", "value": ["ACL", "EMNLP"]}])
    meta = {"year": 2020, "venue": "ACL"}
    assert [condition_matches(meta, c) for c in as_text] == [condition_matches(meta, c) for c in as_dicts] == [True, True]
    assert coerce_filters("doi exists") == (Condition("doi", "exists"),)
    assert coerce_filters(None) == ()


# ------------------------------------------------------------------------------------------ meaning
# an independent, deliberately naive reference of the documented meaning


def _ref_values(meta, path, deep=False):
    nodes = [meta]
    for part in path.split("."):
        nxt = []
        for n in nodes:
            stack = [n]
            while stack:
                x = stack.pop()
                if isinstance(x, list):
                    stack.extend(x)
                elif isinstance(x, dict) and part in x:
                    nxt.append(x[part])
        nodes = nxt
    out = []
    stack = list(nodes)
    while stack:
        x = stack.pop()
        if isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            if deep:
                stack.extend(x.values())
        elif x is not None:
            out.append(x)
    return out


def _ref_num(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        s = v.strip()
        if s.lower() in ("nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity") or "_" in s or s == "":
            return None
        if any(c.isalpha() and c not in "eE" for c in s):
            return None
        return float(s)
    except (ValueError, AttributeError):
        return None


def _ref_text(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    return str(v)


def _ref_satisfies(stored, op, lit):
    """One stored leaf against one literal, for = and the ranges."""
    if isinstance(stored, (int, float)) and not isinstance(stored, bool):
        n = _ref_num(lit)
        if n is None:
            return False
        a, b = float(stored), n
    else:
        a, b = _ref_text(stored), _ref_text(lit)
    return {"=": a == b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def reference(meta, c: Condition) -> bool:
    path = {"author": "authors.name", "author_id": "authors.id"}.get(c.key, c.key)
    if c.op == "exists":
        return len(_ref_values(meta, path, deep=True)) > 0
    if c.op == "not exists":
        return len(_ref_values(meta, path, deep=True)) == 0
    values = _ref_values(meta, path)
    if c.op in ("~=", "^="):  # text values only, ignoring case
        texts = [_ref_text(v).lower() for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)]
        lit = _ref_text(c.value).lower()
        return any(t == lit if c.op == "~=" else t.startswith(lit) for t in texts)
    if c.op in ("=", "!="):
        hit = any(_ref_satisfies(v, "=", c.value) for v in values)
        return hit if c.op == "=" else not hit
    if c.op in ("in", "not in"):
        hit = any(_ref_satisfies(v, "=", lit) for v in values for lit in c.value)
        return hit if c.op == "in" else not hit
    return any(_ref_satisfies(v, c.op, c.value) for v in values)


# an interpreter of the engine query DSL subset to_query_dsl emits, over flatten_for_engine documents


def _engine_eval(clause, doc) -> bool:
    (kind, body), = clause.items()
    if kind == "bool":
        ok = all(_engine_eval(c, doc) for c in body.get("filter", []) + body.get("must", []))
        ok = ok and not any(_engine_eval(c, doc) for c in body.get("must_not", []))
        if "should" in body:
            ok = ok and sum(_engine_eval(c, doc) for c in body["should"]) >= body.get("minimum_should_match", 1)
        return ok
    if kind == "match_all":
        return True
    if kind == "exists":
        f = body["field"]
        return any(k == f or k.startswith(f + ".") for k in doc)
    (field, arg), = body.items()
    values = doc.get(field, [])
    if kind == "term" and isinstance(arg, dict):  # {"value", "case_insensitive": true}
        assert arg["case_insensitive"] is True
        return arg["value"].lower() in [str(v).lower() for v in values]
    if kind == "prefix":
        assert arg["case_insensitive"] is True
        return any(str(v).lower().startswith(arg["value"].lower()) for v in values)
    if kind == "term":
        return arg in values
    if kind == "terms":
        return any(a in values for a in arg)
    if kind == "range":
        (bound, x), = arg.items()
        cmp = {"lt": lambda a: a < x, "lte": lambda a: a <= x, "gt": lambda a: a > x, "gte": lambda a: a >= x}[bound]
        return any(cmp(v) for v in values)
    raise AssertionError(f"unexpected clause {clause}")


def engine_doc(meta):
    kw, num = flatten_for_engine(meta)
    return {**{f"meta_kw.{k}": v for k, v in kw.items()}, **{f"meta_num.{k}": v for k, v in num.items()}}


WORDS = st.sampled_from(["ACL", "EMNLP", "acl", "2019", "2020", "10", "9", "x y", "true", "", "2019-05-01", "Ann", "Bo"])
SCALARS = st.one_of(WORDS, st.integers(-3, 2025), st.sampled_from([2019.0, 2019.5, 0.5, -1.0]), st.booleans(), st.none())
KEYS = st.sampled_from(["year", "venue", "authors", "name", "id", "x"])

def _nest(inner):
    return st.one_of(inner, st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3))


META_VALUES = _nest(_nest(SCALARS))  # scalars, lists and objects, two levels deep (lists of objects, objects of lists...)
METAS = st.dictionaries(KEYS, META_VALUES, max_size=4)
LITERALS = st.one_of(WORDS.filter(bool), st.integers(-3, 2025), st.sampled_from([2019.0, 2019.5, 0.5]), st.booleans())
PATHS = st.sampled_from(["year", "venue", "authors", "authors.name", "authors.id", "author", "author_id", "x.year", "missing"])


@st.composite
def conditions(draw):
    op = draw(st.sampled_from(OPERATORS))
    key = draw(PATHS)
    if op in ("exists", "not exists"):
        return Condition(key, op)
    if op in ("in", "not in"):
        return Condition(key, op, tuple(draw(st.lists(LITERALS, min_size=1, max_size=3))))
    return Condition(key, op, draw(LITERALS))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(meta=METAS, c=conditions())
def test_meaning_matches_the_reference_and_the_engine_translation(meta, c):
    expected = reference(meta, c)
    assert condition_matches(meta, c) == expected
    assert _engine_eval(condition_dsl(c), engine_doc(meta)) == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metas=st.lists(METAS, max_size=6), c=conditions())
def test_columns_evaluate_like_the_reference(metas, c):
    """The embedded backend's columnar evaluation (numpy over all papers) against the reference, paper by paper."""
    cols = MetadataColumns([f"p{i}" for i in range(len(metas))], metas)
    assert cols.allowed([c]) == {f"p{i}" for i, m in enumerate(metas) if reference(m, c)}


@settings(max_examples=200, deadline=None)
@given(meta=METAS, c=conditions())
def test_grammar_round_trip_keeps_the_meaning(meta, c):
    again = parse_filter(str(c))
    assert condition_matches(meta, again) == condition_matches(meta, c)


@pytest.mark.parametrize("meta, text, expected", [
    ({"year": 2019}, "year=2019", True),
    ({"year": "2019"}, "year=2019", True),  # text compares as text
    ({"year": 2019}, "year>=2019.0", True),
    ({"year": 2019}, "year>10", True),  # numbers as numbers...
    ({"year": "2019"}, "year>10", True),  # ...text as text ("2019" > "10")
    ({"year": "9"}, "year>10", True),  # "9" > "10" as text: documented
    ({"venue": "ACL"}, "venue=acl", False),  # case-sensitive
    ({"venue": "ArXiv"}, "venue~=arxiv", True),  # unless asked: any case
    ({"venue": "ArXiv"}, "venue~=arx", False),
    ({"authors": [{"name": "Masashi Sugiyama"}]}, "author^=masashi", True),  # a prefix, any case
    ({"authors": [{"name": "Masashi Sugiyama"}]}, "author^=Sugiyama", False),
    ({"year": 2019}, "year^=20", False),  # text operators: stored numbers are not text
    ({}, "venue!=ACL", True),  # negations keep papers without the key
    ({}, "venue not in (ACL)", True),
    ({}, "year<3000", False),
    ({"venue": None}, "venue exists", False),
    ({"authors": []}, "author exists", False),
    ({"authors": [{"name": "A"}, {"name": "B", "id": "7"}]}, "author=B", True),
    ({"authors": [{"name": "A"}, {"name": "B", "id": "7"}]}, "author!=B", False),
    ({"authors": [{"name": "A"}, {"name": "B", "id": "7"}]}, "author_id=7", True),
    ({"open": True}, "open=true", True),
    ({"pd": "2019-05-01"}, "pd>=2019-01", True),
    ({"pd": "2019-05-01"}, "pd<2019-05-02", True),
    ({"fields_of_study": ["Medicine", "Biology"]}, "fields_of_study not in (Physics)", True),
    ({"fields_of_study": ["Medicine", "Biology"]}, "fields_of_study not in (Biology)", False),
    ({"external_ids": {"doi": "10.1/x"}}, "external_ids.doi exists", True),
    ({"external_ids": {"doi": "10.1/x"}}, "external_ids exists", True),
])
def test_documented_examples(meta, text, expected):
    c = parse_filter(text)
    assert condition_matches(meta, c) is expected
    assert reference(meta, c) is expected
    assert _engine_eval(condition_dsl(c), engine_doc(meta)) is expected


def test_engine_query_is_anded_to_the_conditions():
    flt = MetadataFilter(coerce_filters("year>=2019"), {"term": {"lang": "en"}})
    clauses = to_query_dsl(flt)
    assert clauses[-1] == {"term": {"lang": "en"}} and len(clauses) == 2


# ------------------------------------------------------------------------------------------ embedded backend

DIM = 16
VENUES = ["ACL", "EMNLP", "NAACL", "ICML", None]


def synthetic_papers(n, seed=0, dim=DIM):
    """n papers with random unit sentence vectors, words drawn from a small vocabulary, and metadata
    with every kind of value (ints, strings, lists of objects, missing keys, booleans)."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(60)]
    out = []
    for i in range(n):
        k = int(rng.integers(2, 5))
        sentences = [" ".join(rng.choice(vocab, 6)) + "." for _ in range(k)]
        facets = [["background", "method", "result", "other"][int(j)] for j in rng.integers(0, 4, k)]
        meta = {"format": "jsonl"}
        if i % 7:
            meta["year"] = int(2010 + i % 13)
        venue = VENUES[i % len(VENUES)]
        if venue:
            meta["venue"] = venue
        meta["authors"] = [{"name": f"A{j}", **({"id": str(j)} if j % 2 else {})} for j in rng.integers(0, 30, int(rng.integers(0, 4)))]
        if i % 3 == 0:
            meta["external_ids"] = {"doi": f"10.1/{i}"}
        if i % 11 == 0:
            meta["year"] = str(2010 + i % 13)  # a text year: filters compare it as text
        meta["open_access"] = bool(i % 2)
        v = rng.normal(size=(k, dim)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out.append(IndexedPaper(Paper(f"p{i:04d}", f"title {i} " + " ".join(rng.choice(vocab, 3)), sentences, facets, meta), v))
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    backend = EmbeddedBackend(tmp_path_factory.mktemp("filters") / "ix")
    backend.ensure(IndexMeta("synthetic", DIM))
    papers = synthetic_papers(300)
    backend.upsert(papers)
    yield backend, {p.paper_id: p for p in papers}
    backend.close()


def brute_knn(papers, allowed, q, facet=None):
    """The embedded backend's kNN score model, by brute force over the allowed papers."""
    out = {}
    for pid in allowed:
        ip = papers[pid]
        rows = [i for i, f in enumerate(ip.paper.facets) if facet is None or f == facet]
        if rows:
            stored = ip.vectors[rows].astype(np.float16).astype(np.float32)  # the embedded backend keeps float16 rows
            out[pid] = float((q @ stored.T).max(axis=1).mean())
    return out


FILTER_CASES = [
    ["year>=2015"], ["year<2012"], ["year=2019"], ["year!=2019"], ["year>2015", "year<=2018"], ["year>=2021"],
    ["venue=ACL"], ["venue!=ACL"], ["venue in (ACL, EMNLP)"], ["venue not in (ACL, EMNLP)"], ["venue exists"],
    ["venue not exists"], ["author=A3"], ["author!=A3"], ["author_id in (3, 5, 7)"], ["author exists"],
    ["external_ids.doi exists"], ["external_ids.doi not exists"], ["open_access=true"], ["year>=2015", "venue=ACL", "open_access=false"],
    ["nothing exists"], ["nothing!=1"], ["year=2022"],
]


@pytest.mark.parametrize("conds", FILTER_CASES, ids=[";".join(c) for c in FILTER_CASES])
@pytest.mark.parametrize("facet", [None, "method"])
def test_embedded_first_stage_is_prefiltered_and_exact(synthetic, conds, facet):
    backend, papers = synthetic
    flt = MetadataFilter(coerce_filters(conds))
    allowed = {pid for pid, ip in papers.items() if all(reference(ip.paper.metadata, c) for c in flt.conditions)}
    assert backend.filter_ids(flt) == allowed
    rng = np.random.default_rng(len(conds))
    q = rng.normal(size=(2, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    req = FirstStageRequest(text="w1 w2 w3 w4 w5", vectors=q, facet=facet, k=1000, knn_k=1000, bm25_k=1000, filter=flt,
                            with_papers=False)
    got = backend.first_stage(req)
    assert {c.paper_id for c in got} <= allowed  # nothing outside the filter, ever
    expected_knn = brute_knn(papers, allowed, q, facet)
    knn = {c.paper_id: c.knn for c in got if c.knn}
    assert set(knn) == {p for p, s in expected_knn.items() if s} and all(
        knn[p] == pytest.approx(expected_knn[p], abs=1e-5) for p in knn)
    # BM25 sees the same allowed set
    assert set(backend.bm25(req.text, 1000, restrict_to=frozenset(allowed))) == {c.paper_id for c in got if c.bm25}


def test_selective_filter_still_returns_k_hits_on_the_ann_path(tmp_path):
    """< 1% of the papers pass the filter; the unfiltered kNN runs on faiss HNSW (exact_threshold is tiny),
    the filtered one is exact over the few allowed papers and returns all k of them, best first."""
    backend = EmbeddedBackend(tmp_path / "ix", exact_threshold=50)
    backend.ensure(IndexMeta("synthetic", DIM))
    papers = synthetic_papers(1500, seed=3)
    rare = {p.paper_id for p in papers[::200]}  # 8 papers: 0.53%
    for p in papers:
        p.paper.metadata["venue"] = "Rare Workshop" if p.paper_id in rare else "Big Conf"
    backend.upsert(papers)
    by_id = {p.paper_id: p for p in papers}
    q = papers[1].vectors[:1]
    req = dict(text="w1 w2", vectors=q, k=8, knn_k=8, bm25_k=8, with_papers=False)
    unfiltered = backend.first_stage(FirstStageRequest(**req))
    assert len(unfiltered) == 8 and not {c.paper_id for c in unfiltered} & rare  # a post-filter would be empty
    flt = MetadataFilter(coerce_filters(["venue='Rare Workshop'"]))
    got = backend.first_stage(FirstStageRequest(**req, filter=flt))
    assert {c.paper_id for c in got} == rare
    expected = brute_knn(by_id, rare, q)
    ranked_by_knn = sorted((c for c in got), key=lambda c: -c.knn)
    assert [c.paper_id for c in ranked_by_knn] == sorted(rare, key=lambda p: -expected[p])
    backend.close()


def test_filter_and_pool_intersect_and_empty_filters_return_nothing(synthetic):
    backend, papers = synthetic
    q = np.ones((1, DIM), dtype=np.float32) / np.sqrt(DIM)
    pool = frozenset(list(papers)[:40])
    flt = MetadataFilter(coerce_filters(["venue=ACL"]))
    got = backend.first_stage(FirstStageRequest(text="w1", vectors=q, k=100, knn_k=100, bm25_k=100, restrict_to=pool, filter=flt))
    assert {c.paper_id for c in got} == {p for p in pool if papers[p].paper.metadata.get("venue") == "ACL"}
    none = MetadataFilter(coerce_filters(["year>3000"]))
    assert backend.first_stage(FirstStageRequest(text="w1", vectors=q, filter=none)) == []


def test_engine_filter_is_refused_on_the_embedded_backend(synthetic):
    from esqbe.errors import BackendError

    backend, _ = synthetic
    with pytest.raises(BackendError, match="needs the elasticsearch or opensearch backend"):
        backend.filter_ids(MetadataFilter((), {"term": {"lang": "en"}}))


def test_filters_follow_updates(tmp_path):
    backend = EmbeddedBackend(tmp_path / "ix")
    backend.ensure(IndexMeta("synthetic", DIM))
    papers = synthetic_papers(10)
    backend.upsert(papers)
    keys = backend.stats()["metadata_keys"]  # what --filter can name, with how many papers have each
    assert keys["format"] == 10 and keys["venue"] == sum(1 for p in papers if "venue" in p.paper.metadata)
    flt = MetadataFilter(coerce_filters(["venue=Moved"]))
    assert backend.filter_ids(flt) == set()
    changed = papers[4]
    changed.paper.metadata["venue"] = "Moved"  # metadata is part of the content hash: the upsert rewrites it
    assert backend.upsert([changed]).replaced == 1
    assert backend.filter_ids(flt) == {changed.paper_id}
    backend.delete([changed.paper_id])
    assert backend.filter_ids(flt) == set()
    backend.close()
