"""The hard corpus: every sentence in ../shared/data encoded with the default model and runtime, as
`esqbe encode` does, cached; then extended to any number of papers (see `extend`).

    PYTHONPATH=. .venv/bin/python benchmarks/hard_corpus.py build --cache CACHE                  # every paper (~2 h on 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/hard_corpus.py build --cache CACHE --max-chunks 5   # docs/performance.md's corpus
    PYTHONPATH=. .venv/bin/python benchmarks/hard_corpus.py count --cache CACHE
    PYTHONPATH=. .venv/bin/python benchmarks/hard_corpus.py compare --cache CACHE --sample 300000

`build` writes CACHE/papers.jsonl (every paper, ids prefixed by their source) and encodes it through
`Index.encode_files` (the library function behind `esqbe encode`: default settings, so the default model,
runtime and encoder mode; papers without labels are tagged, `facets=keep`) into CACHE/encoded/. Sources:

- CSFCube dev: all 4,205 abstracts, with the collection's predicted labels
- CSAbstruct train/dev/test: 2,189 abstracts with gold labels (a paper in two splits is kept once)
- S2ORC: the 1,000-row metadata sample and the S2AG abstracts and S2ORC samples (abstracts, as esqbe reads them)
- CL-SciSumm: the 978 ScisummNet reference papers (packed Reference_XML), the 40 training reference papers and
  their citing papers (Citance_XML), each as a full text: every `<S>` sentence in document order (sid 0, the
  title, as the title), as `esqbe eval clscisumm` indexes reference papers; at most LIMITS["sentences"] each
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("ESQBE_SHARED", REPO.parent / "shared"))
DATA = SHARED / "data"
FACETS = ("background", "method", "result")


# --- gathering -------------------------------------------------------------------------------------
def _full_text(paper_id: str, xml: str) -> dict | None:
    from esqbe.domain import LIMITS
    from esqbe.encode.citations import _S, _text

    title, sentences = "", []
    for sid, body in _S.findall(xml):
        text = _text(body)
        if not text:
            continue
        if sid == "0" and not title:
            title = text
        else:
            sentences.append(text)
    if not sentences:
        return None
    return {"id": paper_id, "title": title[:4000], "abstract": sentences[: LIMITS["sentences"]]}


def gather() -> tuple[list[dict], dict]:
    """Every paper of the shared data as a plain-JSONL record, and where each came from."""
    from esqbe.encode.citations import _members
    from esqbe.ingest.readers import read_papers

    out: dict[str, dict] = {}
    counts: dict[str, int] = {}

    def add(source: str, rec: dict) -> None:
        rec["id"] = f"{source}:{rec['id']}"
        if rec["id"] not in out:
            out[rec["id"]] = rec
            counts[source] = counts.get(source, 0) + 1

    def from_reader(source: str, path: Path) -> None:
        for p in read_papers(str(path)):
            rec = {"id": p.paper_id, "title": p.title, "abstract": list(p.sentences)}
            if p.is_labeled:
                rec["facets"] = list(p.facets)
            add(source, rec)

    from_reader("csfcube", DATA / "csfcube-dev" / "abstracts-csfcube-preds.jsonl")
    for split in ("train", "dev", "test"):
        from_reader("csabstruct", DATA / "csabstruct" / f"{split}.jsonl")
    from_reader("s2orc", DATA / "s2orc" / "metadata-sample.jsonl")
    for name in ("abstracts-sample.jsonl.gz", "s2orc-sample.jsonl.gz"):
        from_reader("s2ag", DATA / "s2orc" / "s2ag-datasets-samples" / name)
    task1 = DATA / "clscisumm" / "Training-Set-2019" / "Task1"
    for name, data in _members(task1 / "From-ScisummNet-2019.Reference_XML.tar.gz"):
        if name.endswith(".xml"):
            rec = _full_text(Path(name).stem, data.decode("utf-8", errors="replace"))
            if rec:
                add("scisummnet", rec)
    for xml in sorted((task1 / "From-Training-Set-2018").glob("*/*_XML/*.xml")):
        kind = "clscisumm-ref" if xml.parent.name == "Reference_XML" else "clscisumm-citing"
        rec = _full_text(xml.stem, xml.read_bytes().decode("utf-8", errors="replace"))
        if rec:
            add(kind, rec)
    return list(out.values()), counts


FULL_TEXT_CHUNK = 40  # full texts per encoded file: a partial build (stopped at any time) leaves whole files


def build(cache: Path, max_chunks: int | None = None) -> dict:
    """Encode the gathered papers in chunks, each into its own Parquet file (encoded/NNN/), abstracts first, then
    the full texts in a seeded order, FULL_TEXT_CHUNK at a time; a chunk already encoded is kept (the build
    resumes). What was encoded when a build is stopped is a seeded sample of the full texts. `max_chunks` stops
    after the first that many chunks (5: docs/performance.md's corpus, all abstracts and 160 full texts drawn)."""
    import esqbe

    cache.mkdir(parents=True, exist_ok=True)
    papers, counts = gather()
    abstracts = [r for r in papers if r["id"].split(":", 1)[0] not in FULL_TEXT_SOURCES]
    full = [r for r in papers if r["id"].split(":", 1)[0] in FULL_TEXT_SOURCES]
    full = [full[i] for i in np.random.default_rng(0).permutation(len(full))]
    chunks = [abstracts] + [full[i:i + FULL_TEXT_CHUNK] for i in range(0, len(full), FULL_TEXT_CHUNK)]
    if max_chunks is not None:
        chunks = chunks[:max_chunks]
    print(f"gathered {len(papers)} papers, {sum(len(r['abstract']) for r in papers)} sentences: {counts}; "
          f"{len(chunks)} chunks", file=sys.stderr, flush=True)
    index = esqbe.encoder_only()
    t0 = time.perf_counter()
    for i, chunk in enumerate(chunks):
        out = cache / "encoded" / f"{i:03d}"
        if list(out.glob("*.parquet")):
            continue
        src = cache / "papers" / f"{i:03d}.jsonl"
        src.parent.mkdir(parents=True, exist_ok=True)
        with src.open("w", encoding="utf-8") as fp:
            for rec in chunk:
                fp.write(json.dumps(rec) + "\n")
        tmp = cache / "encoded" / f"{i:03d}.tmp"
        report = index.encode_files([str(src)], str(tmp))
        tmp.rename(out)
        print(f"chunk {i}: {report.encoded} papers, {sum(len(r['abstract']) for r in chunk)} sentences, "
              f"tagged {report.tagged}, {time.perf_counter() - t0:.0f} s so far", file=sys.stderr, flush=True)
    info = {"papers_by_source": counts, "encode_seconds": time.perf_counter() - t0,
            "settings": {"model": index.settings.model, "encoder_backend": index.settings.encoder_backend,
                         "encoder_mode": index.settings.encoder_mode, "facets": index.settings.facets}}
    (cache / "build.json").write_text(json.dumps(info, indent=1, default=str))
    return info


FULL_TEXT_SOURCES = ("scisummnet", "clscisumm-ref", "clscisumm-citing")


# --- reading the cache ------------------------------------------------------------------------------
def load(cache: Path) -> dict:
    """The encoded corpus as arrays: vectors (float32, unit), facet per row, paper index per row, paper ids,
    and the sentence/label/title columns (Arrow) for writing extended corpora."""
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted((cache / "encoded").glob("[0-9][0-9][0-9]/*.parquet"))]
    import pyarrow as pa

    t = pa.concat_tables(tables)
    counts = np.array([len(v) for v in t.column("facets").to_pylist()])
    flat_vec = t.column("vectors").combine_chunks().flatten().flatten().to_numpy(zero_copy_only=False)
    dim = flat_vec.size // int(counts.sum())
    return {
        "table": t,
        "vectors": flat_vec.reshape(-1, dim).astype(np.float32),
        "facets": np.array(t.column("facets").combine_chunks().flatten().to_pylist(), dtype=object),
        "paper": np.repeat(np.arange(t.num_rows), counts),
        "counts": counts,
        "ids": t.column("paper_id").to_pylist(),
    }


def count(cache: Path) -> dict:
    c = load(cache)
    src = [i.split(":", 1)[0] if ":" in i else "other" for i in c["ids"]]
    by_source: dict[str, dict] = {}
    for s, n in zip(src, c["counts"]):
        d = by_source.setdefault(s, {"papers": 0, "sentences": 0})
        d["papers"] += 1
        d["sentences"] += int(n)
    facets, n = np.unique(c["facets"], return_counts=True)
    papers_with = {f: int(len(np.unique(c["paper"][c["facets"] == f]))) for f in FACETS}
    return {"papers": len(c["ids"]), "sentences": int(c["counts"].sum()), "dim": int(c["vectors"].shape[1]),
            "by_source": by_source, "sentences_per_facet": dict(zip(facets.tolist(), n.tolist())),
            "papers_with_facet": papers_with}


# --- extending ------------------------------------------------------------------------------------
#: a full text is cut into units of this many consecutive sentences (drawn per unit); an abstract is one unit
UNIT_SIZES = (3, 13)
#: longer "abstracts" than this are cut like full texts
WHOLE_MAX = 30
NEIGHBOURS = 16  # real neighbours (of other papers, same facet) a synthetic sentence is interpolated between


def units_of(c: dict, papers: np.ndarray, seed: int = 0) -> list[np.ndarray]:
    """Row numbers of the paper-sized units of the given papers: an abstract whole, a full text in consecutive
    pieces of 3..12 sentences (so that units have the ~7.5 sentences of an abstract, as a 1M-paper index has)."""
    rng = np.random.default_rng(seed)
    starts = np.r_[0, np.cumsum(c["counts"])]
    out = []
    for p in papers:
        lo, hi = int(starts[p]), int(starts[p + 1])
        if hi - lo <= WHOLE_MAX:
            out.append(np.arange(lo, hi))
            continue
        while lo < hi:
            n = int(rng.integers(*UNIT_SIZES))
            out.append(np.arange(lo, min(hi, lo + n)))
            lo += n
    return out


def neighbours(c: dict, rows: np.ndarray, k: int = NEIGHBOURS) -> np.ndarray:
    """(len(rows), k) row numbers: per row, its k nearest rows of the same facet among `rows` that belong to
    another paper (-1 padded), found with a faiss IVF (approximate; they only seed the interpolation)."""
    import faiss

    out = np.full((len(rows), k), -1, dtype=np.int64)
    vec, fac, pap = c["vectors"], c["facets"][rows], c["paper"]
    for f in np.unique(fac):
        sel = rows[fac == f]
        x = np.ascontiguousarray(vec[sel])
        if len(sel) < 2:
            continue
        nlist = int(max(1, min(4 * np.sqrt(len(sel)), len(sel) // 39)))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(x.shape[1]), x.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(x[np.random.default_rng(0).choice(len(x), min(len(x), 40 * nlist), replace=False)])
        index.add(x)
        index.nprobe = min(nlist, 12)
        want = min(len(sel), 4 * k)
        _, ids = index.search(x, want)
        ids = np.where(ids >= 0, sel[np.clip(ids, 0, None)], -1)
        same = (ids < 0) | (pap[np.clip(ids, 0, None)] == pap[sel][:, None])
        order = np.argsort(same, axis=1, kind="stable")[:, :k]  # other papers first, in distance order
        got = np.take_along_axis(ids, order, axis=1)
        got[np.take_along_axis(same, order, axis=1)] = -1
        out[np.flatnonzero(fac == f)] = got
    return out


class Extender:
    """Synthetic papers from real ones. A synthetic paper copies a real unit's shape (sentence count, facet per
    sentence, title); each of its sentences is a point between two real neighbours of the unit's sentence
    (same facet, other papers, drawn from its NEIGHBOURS nearest), w*n1 + (1-w)*n2 with w ~ U(0, 1), plus
    `sigma` times the difference of two random real rows of that facet (noise with the real data's own
    covariance, not isotropic), normalised; its text is the nearer neighbour's. No synthetic sentence copies its
    own unit's vector, so a real paper's variants are not its near-duplicates."""

    def __init__(self, c: dict, basis_papers: np.ndarray, sigma: float, seed: int = 0):
        self.c, self.sigma = c, sigma
        self.units = units_of(c, basis_papers, seed)
        rows = np.concatenate(self.units)
        self.rows = rows
        self.nb = np.full((len(c["facets"]), NEIGHBOURS), -1, dtype=np.int64)
        self.nb[rows] = neighbours(c, rows)
        self.by_facet = {f: rows[c["facets"][rows] == f] for f in np.unique(c["facets"][rows])}

    def unit_rows(self) -> int:
        return len(self.rows)

    def make(self, unit_ids: np.ndarray, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """For the given units (indexes into self.units): per synthetic paper its source rows (for shape, facet and
        title), and the synthetic vectors and text rows, row-aligned with the concatenated source rows."""
        c = self.c
        src = [self.units[u] for u in unit_ids]
        rows = np.concatenate(src)
        nb = self.nb[rows]
        n_ok = np.maximum((nb >= 0).sum(axis=1), 1)
        # neighbours are stored nearest first with -1 at the end: draw two among the valid ones
        a = nb[np.arange(len(rows)), (rng.random(len(rows)) * n_ok).astype(int)]
        b = nb[np.arange(len(rows)), (rng.random(len(rows)) * n_ok).astype(int)]
        a = np.where(a < 0, rows, a)
        b = np.where(b < 0, rows, b)
        w = rng.random(len(rows), dtype=np.float32)[:, None]
        vec = c["vectors"]
        out = w * vec[a] + (1 - w) * vec[b]
        if self.sigma:
            fac = c["facets"][rows]
            noise = np.empty_like(out)
            for f, pool in self.by_facet.items():
                m = fac == f
                k = int(m.sum())
                noise[m] = vec[pool[rng.integers(0, len(pool), k)]] - vec[pool[rng.integers(0, len(pool), k)]]
            out += np.float32(self.sigma) * noise
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        text = np.where(w[:, 0] >= 0.5, a, b)
        return src, out.astype(np.float32), text


# --- measuring how hard a set of vectors is ------------------------------------------------------------
class RowSet:
    """Vectors, paper numbers and facet codes written in the embedded index's own row layout (vectors.f16,
    rows.pno, rows.facet), so that esqbe's own recall code (`_State`, `exact_top_papers`, `calibrate_nprobe`)
    runs on it unchanged."""

    def __init__(self, path: Path, vectors: np.ndarray, pno: np.ndarray, facets: np.ndarray):
        from esqbe.backends.embedded.layout import _FACET_CODES, _State

        path.mkdir(parents=True, exist_ok=True)
        order = np.argsort(pno, kind="stable")
        vectors.astype(np.float16)[order].tofile(path / "vectors.f16")
        pno[order].astype(np.int32).tofile(path / "rows.pno")
        np.array([_FACET_CODES.get(f, _FACET_CODES["unlabeled"]) for f in facets[order]], dtype=np.int8).tofile(path / "rows.facet")
        self.st = _State(1, len(pno), vectors.shape[1], path, np.zeros(0, dtype=np.int64), int(pno.max()) + 1, {})


def hardness(rs: RowSet, facet: str, queries: int = 500, seed: int = 0, ivf: bool = True) -> dict:
    """Per facet: the cosine of the 1st, 10th and 100th nearest other paper (best sentence) of sampled rows,
    relative contrast (mean distance to a random row / distance to the nearest other paper), and, with `ivf`,
    the IVF the writer would build on these rows: its nlist, the nprobe calibration chooses for 0.95, and
    recall@100 at nprobe 8 / 32 (esqbe's calibration code, same sample)."""
    from esqbe.backends.embedded.layout import _FACET_CODES
    from esqbe.backends.embedded.recall import exact_top_papers, facet_rows

    st = rs.st
    code = _FACET_CODES[facet]
    rows = facet_rows(st, code)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(rows), size=min(queries, len(rows)), replace=False))
    q = np.asarray(st.vec[rows[pick]], dtype=np.float32)
    own = np.asarray(st.pno[rows[pick]]).astype(np.int64)
    _, cos = exact_top_papers(st, rows, q, 100, own)
    rand = np.asarray(st.vec[rows[rng.integers(0, len(rows), 2000)]], dtype=np.float32)
    mean_d = np.sqrt(np.clip(2 - 2 * (q @ rand.T), 0, None)).mean(axis=1)
    nn_d = np.sqrt(np.clip(2 - 2 * cos[:, 0], 1e-12, None))
    out = {"rows": int(len(rows)), "top1": float(np.median(cos[:, 0])), "top10": float(np.median(cos[:, 9])),
           "top100": float(np.median(cos[:, 99])), "mean_cos_random": float(np.median(q @ rand.T)),
           "relative_contrast": float(np.median(mean_d / nn_d))}
    if ivf:
        import faiss

        from esqbe.backends.embedded.recall import ann_candidates, calibrate_nprobe, recall_of

        nlist = int(np.clip(min(2 * np.sqrt(len(rows)), len(rows) / 39), 1, 2048))
        train = np.asarray(st.vec[rows[np.sort(rng.choice(len(rows), min(len(rows), 40 * nlist), replace=False))]], dtype=np.float32)
        index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(st.dim), st.dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                              faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = 10
        index.train(train)
        for lo in range(0, len(rows), 200_000):
            part = rows[lo:lo + 200_000]
            index.add_with_ids(np.asarray(st.vec[part], dtype=np.float32), np.asarray(st.pno[part]).astype(np.int64))
        cal = calibrate_nprobe(st, code, index, target=0.95, oversample=4)
        truth, _ = exact_top_papers(st, rows, q, 100, own)
        for nprobe in (8, 32):
            sims, ids = index.search(q, 4 * 100 + 16, params=faiss.SearchParametersIVF(nprobe=nprobe))
            found = [x[x != o] for x, o in zip(ann_candidates(ids, sims, 100), own)]
            r = recall_of(found, truth)
            out[f"recall_nprobe{nprobe}"] = {"mean": float(r.mean()), "p10": float(np.percentile(r, 10))}
        out.update(nlist=nlist, calibrated_nprobe=cal["nprobe"], calibration_recall=cal["recall"])
    return out


def extended_rows(ext: Extender, n_rows: int, rng: np.random.Generator, start_pno: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """About n_rows synthetic rows: (vectors, paper numbers from start_pno, facets)."""
    vecs, pnos, facs, pno, done = [], [], [], start_pno, 0
    while done < n_rows:
        unit_ids = rng.integers(0, len(ext.units), 2000)
        src, v, _ = ext.make(unit_ids, rng)
        sizes = np.array([len(s) for s in src])
        vecs.append(v)
        pnos.append(np.repeat(np.arange(pno, pno + len(src)), sizes))
        facs.append(ext.c["facets"][np.concatenate(src)])
        pno += len(src)
        done += len(v)
    return np.concatenate(vecs)[:n_rows], np.concatenate(pnos)[:n_rows], np.concatenate(facs)[:n_rows]


def choose(out: dict, cache: Path) -> float:
    """The sigma whose IVF is as hard as the real corpus's at the same size: the smallest sum over facets of the
    differences in recall@100 at nprobe 8 and 32 (what the first stage depends on); the nearest-neighbour cosines
    and relative contrast are reported beside it (`cosine_gap`). Stored in CACHE/sigma.json for write_corpus."""
    real = "real (all)"
    names = list(next(iter(out["facets"].values())))

    def ivf_gap(name: str) -> float:
        return sum(abs(f[name][f"recall_nprobe{p}"]["mean"] - f[real][f"recall_nprobe{p}"]["mean"])
                   for f in out["facets"].values() for p in (8, 32))

    def cosine_gap(name: str) -> float:
        return sum(abs(f[name][m] - f[real][m]) for f in out["facets"].values() for m in ("top1", "top10", "top100")) + \
            sum(abs(float(np.log(f[name]["relative_contrast"] / f[real]["relative_contrast"]))) for f in out["facets"].values())

    out["gap"] = {n: {"ivf_recall": round(ivf_gap(n), 4), "cosines": round(cosine_gap(n), 4)} for n in names if n != real}
    best = min((n for n in names if n.startswith("extended")), key=ivf_gap)
    out["chosen_sigma"] = float(best.split("=")[1])
    (cache / "sigma.json").write_text(json.dumps({"sigma": out["chosen_sigma"], "gap": out["gap"]}))
    return out["chosen_sigma"]


def compare(cache: Path, work: Path, sigmas: list[float], share: float, queries: int, ivf: bool) -> dict:
    """Real against extended at equal size: the real corpus (its units) against `share` of its papers extended
    to the same number of rows, and `share` of the papers alone (the trend with size), per facet and sigma."""
    import shutil

    c = load(cache)
    rng = np.random.default_rng(0)
    n_papers = len(c["ids"])
    basis = np.sort(rng.choice(n_papers, size=int(share * n_papers), replace=False))
    real_units = units_of(c, np.arange(n_papers))
    real_pno = np.empty(len(c["facets"]), dtype=np.int64)
    for i, u in enumerate(real_units):
        real_pno[u] = i
    n_rows = len(c["facets"])
    sets = {"real (all)": (c["vectors"], real_pno, c["facets"])}
    sub_rows = np.concatenate([u for u in real_units if np.isin(c["paper"][u[0]], basis)])
    sets[f"real ({share:.0%} of papers)"] = (c["vectors"][sub_rows], real_pno[sub_rows], c["facets"][sub_rows])
    out: dict = {"rows": {}, "facets": {}}
    for sigma in sigmas:
        ext = Extender(c, basis, sigma)
        sub = ext.rows
        v, p, f = extended_rows(ext, n_rows - len(sub), np.random.default_rng(1), int(real_pno.max()) + 1)
        sets[f"extended sigma={sigma}"] = (np.concatenate([c["vectors"][sub], v]), np.concatenate([real_pno[sub], p]),
                                           np.concatenate([c["facets"][sub], f]))
    for name, (v, p, f) in sets.items():
        d = work / "rowset"
        shutil.rmtree(d, ignore_errors=True)
        rs = RowSet(d, v, p, f)
        out["rows"][name] = int(len(p))
        for facet in FACETS:
            out["facets"].setdefault(facet, {})[name] = hardness(rs, facet, queries, ivf=ivf)
            print(name, facet, json.dumps(out["facets"][facet][name]), file=sys.stderr, flush=True)
        shutil.rmtree(d, ignore_errors=True)
    choose(out, cache)
    return out


#: the noise scale of synthetic sentences, chosen by `compare` (docs/performance.md)
SIGMA = 0.6
_EXTENDER: dict = {}


def extender(cache: Path, sigma: float | None = None) -> Extender:
    """An Extender over every real paper of the cache (made once per process), with the sigma `compare` chose
    (CACHE/sigma.json), else SIGMA."""
    if sigma is None:
        chosen = cache / "sigma.json"
        sigma = float(json.loads(chosen.read_text())["sigma"]) if chosen.is_file() else SIGMA
    key = (str(cache), sigma)
    if key not in _EXTENDER:
        c = load(cache)
        _EXTENDER[key] = Extender(c, np.arange(len(c["ids"])), sigma)
    return _EXTENDER[key]


def write_corpus(cache: Path, out: Path, n: int, seed: int, prefix: str = "p", start: int = 0,
                 shard: int = 100_000) -> list[Path]:
    """The hard corpus's first n papers (ids prefix + 7 digits from `start`) as pre-encoded Parquet (the `esqbe
    encode` schema, the real model's metadata): papers 0 .. U-1 are the real units verbatim (abstracts, and full
    texts cut into 3..12-sentence units), the rest synthetic papers (`Extender`) made from seeded real units.
    `start` > 0 (new papers for an upsert) gives synthetic papers only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from esqbe.ingest.encoded import arrow_schema, read_meta

    ext = extender(cache)
    c = ext.c
    meta = read_meta(sorted((cache / "encoded").glob("[0-9][0-9][0-9]/*.parquet"))[0])
    sents = c["table"].column("sentences").combine_chunks().flatten()
    titles = c["table"].column("title").combine_chunks()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for lo in range(start, start + n, shard):
        hi = min(start + n, lo + shard)
        real = np.arange(lo, min(hi, len(ext.units))) if lo < len(ext.units) else np.zeros(0, dtype=np.int64)
        src_real = [ext.units[u] for u in real]
        src_syn, vec_syn, text_syn = ext.make(rng.integers(0, len(ext.units), hi - lo - len(real)), rng) if hi - lo > len(real) \
            else ([], np.zeros((0, c["vectors"].shape[1]), np.float32), np.zeros(0, dtype=np.int64))
        src = src_real + src_syn
        rows_real = np.concatenate(src_real) if src_real else np.zeros(0, dtype=np.int64)
        vec = np.concatenate([c["vectors"][rows_real], vec_syn]).astype(np.float16).astype(np.float32)
        text_rows = np.concatenate([rows_real, text_syn])
        shape_rows = np.concatenate(src)
        counts = np.array([len(s) for s in src])
        offsets = pa.array(np.r_[0, np.cumsum(counts)].astype(np.int32))
        total = int(counts.sum())
        dim = vec.shape[1]
        inner = pa.ListArray.from_arrays(pa.array(np.arange(0, total * dim + 1, dim, dtype=np.int32)), pa.array(vec.reshape(-1)))
        table = pa.Table.from_arrays(
            [
                pa.array([f"{prefix}{i:07d}" for i in range(lo, hi)]),
                titles.take(pa.array(c["paper"][[s[0] for s in src]])),
                pa.ListArray.from_arrays(offsets, sents.take(pa.array(text_rows))),
                pa.ListArray.from_arrays(offsets, pa.array(list(c["facets"][shape_rows]))),
                pa.ListArray.from_arrays(offsets, inner),
                pa.nulls(hi - lo, pa.string()),
            ],
            schema=arrow_schema(meta),
        )
        path = out / f"{prefix}-{lo:08d}.parquet"
        pq.write_table(table, path, row_group_size=8192, compression={"paper_id": "zstd", "title": "zstd", "sentences": "zstd",
                                                                      "facets": "zstd", "vectors": "none", "metadata": "zstd"})
        files.append(path)
    return files


def table(result: dict) -> str:
    """The comparison as a markdown table: one row per facet and set."""
    lines = ["| facet | set (rows) | cos 1st / 10th / 100th paper | relative contrast | recall@100 nprobe 8 / 32 (mean; p10) | nlist | calibrated nprobe |",
             "|---|---|---|---|---|---|---|"]
    for facet, sets in result["facets"].items():
        for name, h in sets.items():
            r8, r32 = h.get("recall_nprobe8", {}), h.get("recall_nprobe32", {})
            lines.append(f"| {facet} | {name} ({h['rows']:,}) | {h['top1']:.3f} / {h['top10']:.3f} / {h['top100']:.3f} | "
                         f"{h['relative_contrast']:.3f} | {r8.get('mean', float('nan')):.3f} / {r32.get('mean', float('nan')):.3f} "
                         f"({r8.get('p10', float('nan')):.2f} / {r32.get('p10', float('nan')):.2f}) | {h.get('nlist', '')} | {h.get('calibrated_nprobe', '')} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("build", "count", "gather", "compare", "choose"))
    ap.add_argument("--cache", default=".esqbe-bench/hard")
    ap.add_argument("--work", default="/tmp/h23b-compare")
    ap.add_argument("--sigmas", default="0.0,0.2,0.4")
    ap.add_argument("--share", type=float, default=0.25, help="compare: share of the real papers extended")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--no-ivf", action="store_true")
    ap.add_argument("--max-chunks", type=int, default=None,
                    help="build: stop after the first N chunks (5 = docs/performance.md's 7,147 papers, 78,325 sentences)")
    args = ap.parse_args()
    cache = Path(args.cache)
    if args.command == "gather":
        papers, counts = gather()
        print(json.dumps({"papers": len(papers), "sentences": sum(len(r["abstract"]) for r in papers), "by_source": counts}))
    elif args.command == "build":
        print(json.dumps(build(cache, args.max_chunks), indent=1, default=str))
    elif args.command == "choose":  # the choice again, from a saved comparison
        saved = json.loads((cache / f"compare-{args.share}-{args.sigmas}.json").read_text())
        print(choose(saved, cache), saved["gap"])
    elif args.command == "compare":
        result = compare(cache, Path(args.work), [float(x) for x in args.sigmas.split(",")], args.share,
                         args.queries, not args.no_ivf)
        (cache / f"compare-{args.share}-{args.sigmas}.json").write_text(json.dumps(result, indent=1))
        print(table(result))
        print(f"\ngap to the real corpus (ivf_recall: sum over facets of |recall@100 difference| at nprobe 8 and 32; "
              f"cosines: of |cosine differences| + |log relative-contrast ratio|): {result['gap']}; "
              f"chosen sigma {result['chosen_sigma']}")
    else:
        print(json.dumps(count(cache), indent=1))


if __name__ == "__main__":
    main()
