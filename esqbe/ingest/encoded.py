"""Pre-encoded papers as Parquet: what `esqbe encode` writes and `esqbe index` loads without a model.

One row per paper (the schema a GPU box, a Spark or a Ray job can also write):

    paper_id   string
    title      string
    sentences  list<string>
    facets     list<string>          esqbe labels: background, method, result, other, unlabeled
    vectors    list<list<float32>>   one L2-normalised vector per sentence, `dim` long
    metadata   string (optional)     JSON object of the paper's metadata

The schema metadata key `esqbe` holds `IndexMeta.to_dict()` as JSON (at least `model`, `dim`,
`encoder_mode`); loading checks it against the index like any other write.
"""
from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ..domain import IndexedPaper, IndexMeta, Paper, paper_problem
from .readers import InputError, ReadReport, skipped_record

META_KEY = b"esqbe"
COLUMNS = ("paper_id", "title", "sentences", "facets", "vectors")
NORM_TOLERANCE = 1e-2


#: what each column must hold (its Arrow type is checked once per file), in the words of an error
_COLUMN_TYPES = {
    "paper_id": "string",
    "title": "string",
    "sentences": "list<string> (the abstract's sentences)",
    "facets": "list<string> (one label per sentence)",
    "vectors": "list<list<float32>> (one vector per sentence)",
    "metadata": "string (a JSON object)",
}


def _type_ok(column: str, t) -> bool:
    import pyarrow.types as pt

    def text(t):
        return pt.is_string(t) or pt.is_large_string(t)

    def list_of(t, item):
        return (pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t)) and item(t.value_type)

    if column == "paper_id":
        return text(t) or pt.is_integer(t)
    if column in ("title", "metadata"):
        return text(t) or pt.is_null(t)
    if column in ("sentences", "facets"):
        return list_of(t, text)
    return list_of(t, lambda v: list_of(v, pt.is_floating))  # vectors


def is_parquet(source) -> bool:
    return isinstance(source, (str, Path)) and str(source).lower().endswith(".parquet")


def arrow_schema(meta: IndexMeta):
    import pyarrow as pa

    return pa.schema(
        [
            ("paper_id", pa.string()),
            ("title", pa.string()),
            ("sentences", pa.list_(pa.string())),
            ("facets", pa.list_(pa.string())),
            ("vectors", pa.list_(pa.list_(pa.float32()))),
            ("metadata", pa.string()),
        ],
        metadata={META_KEY: json.dumps(meta.to_dict()).encode()},
    )


def shard_of(paper_id: str, shards: int) -> int:
    """Stable shard of a paper id (crc32), the same on every machine and Python run."""
    return zlib.crc32(str(paper_id).encode("utf-8")) % shards


class EncodedWriter:
    """Write IndexedPapers to one Parquet file, a row group per `write` call."""

    def __init__(self, path: str | Path, meta: IndexMeta):
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.meta = meta
        self.schema = arrow_schema(meta)
        self.rows = 0
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")

    def write(self, papers: Sequence[IndexedPaper]) -> None:
        import pyarrow as pa

        if not papers:
            return
        lengths = np.array([len(p.paper.sentences) for p in papers], dtype=np.int32)
        flat = np.concatenate([np.asarray(p.vectors, dtype=np.float32) for p in papers]).reshape(-1)
        dim = self.meta.dim
        inner = pa.ListArray.from_arrays(pa.array(np.arange(0, len(flat) + 1, dim, dtype=np.int32)), pa.array(flat))
        outer = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32)), inner)
        table = pa.Table.from_arrays(
            [
                pa.array([p.paper_id for p in papers], pa.string()),
                pa.array([p.paper.title for p in papers], pa.string()),
                pa.array([p.paper.sentences for p in papers], pa.list_(pa.string())),
                pa.array([p.paper.facets for p in papers], pa.list_(pa.string())),
                outer.cast(pa.list_(pa.list_(pa.float32()))),
                pa.array([json.dumps(p.paper.metadata, ensure_ascii=False) if p.paper.metadata else None for p in papers],
                         pa.string()),
            ],
            schema=self.schema,
        )
        self._writer.write_table(table)
        self.rows += len(papers)

    def close(self) -> None:
        """Finish the file; it appears under its name only when complete."""
        self._writer.close()
        self._tmp.replace(self.path)

    def abort(self) -> None:
        self._writer.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        self.abort() if exc_type else self.close()


def read_meta(path: str | Path) -> IndexMeta:
    """The encoder metadata of a Parquet file of encoded papers (InputError if it has none or lacks columns)."""
    import pyarrow.parquet as pq

    name = str(path)
    try:
        schema = pq.read_schema(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
        raise InputError(name, 0, "file", f"not a readable Parquet file: {e}") from None
    missing = [c for c in COLUMNS if c not in schema.names]
    if missing:
        raise InputError(name, 0, "schema", f"missing column(s) {', '.join(missing)} (see `esqbe encode --help` for the schema)")
    for column in [c for c in (*COLUMNS, "metadata") if c in schema.names]:
        if not _type_ok(column, schema.field(column).type):
            raise InputError(name, 0, column, f"expected {_COLUMN_TYPES[column]}, got {schema.field(column).type}")
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise InputError(name, 0, "schema", "no `esqbe` schema metadata: which model made these vectors is unknown")
    try:
        return IndexMeta.from_dict(json.loads(raw))
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(name, 0, "schema",
                         f"the `esqbe` metadata is not valid ({e!r}); it needs model, dim, encoder_mode") from None


def read_encoded(path: str | Path, *, batch_size: int = 4096, strict: bool = False,
                 report: ReadReport | None = None) -> Iterator[list[IndexedPaper]]:
    """Batches of IndexedPapers from a Parquet file; bad rows are reported (file:row: field: reason) and
    skipped, or raise InputError with `strict`. Row numbers are 1-based."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    report = report if report is not None else ReadReport()
    meta = read_meta(path)
    name = str(path)
    has_metadata = "metadata" in pq.read_schema(path).names
    columns = list(COLUMNS) + (["metadata"] if has_metadata else [])
    vector_type = pa.list_(pa.list_(pa.float32()))
    row0 = 0
    batches = pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns)
    while True:
        try:
            batch = next(batches)
            vcol = batch.column("vectors")
            if vcol.type != vector_type:  # float64, large or fixed-size lists (Spark, Ray): the same vectors
                vcol = vcol.cast(vector_type)
        except StopIteration:
            break
        except (OSError, ValueError) as e:  # a truncated or corrupt file (pyarrow's errors derive from these)
            error: InputError | None = InputError(name, row0 + 1, "file", f"cannot read further: {e}")
            assert error is not None
            if strict:
                raise error from None
            report.errors.append(error)
            break
        n = batch.num_rows
        ids = batch.column("paper_id").to_pylist()
        titles = batch.column("title").to_pylist()
        sentences = batch.column("sentences").to_pylist()
        facets = batch.column("facets").to_pylist()
        metas = batch.column("metadata").to_pylist() if has_metadata else [None] * n
        # offsets index the child arrays as they are (a batch may be a slice of them); null values read as NaN
        outer_off = np.asarray(vcol.offsets)
        inner = vcol.values
        inner_off = np.asarray(inner.offsets)
        values = inner.values.to_numpy(zero_copy_only=False)
        inner_len = np.diff(inner_off)[outer_off[0] : outer_off[-1]]
        sent_of = np.diff(outer_off)
        bad_dim = np.zeros(n, dtype=bool)
        if len(inner_len):
            wrong = inner_len != meta.dim
            if wrong.any():
                paper_of_vec = np.repeat(np.arange(n), sent_of)
                bad_dim[paper_of_vec[wrong]] = True
        out: list[IndexedPaper] = []
        for i in range(n):
            report.read += 1
            line = row0 + i + 1
            error = None
            if ids[i] is None or not str(ids[i]).strip():
                error = InputError(name, line, "paper_id", "missing or empty")
            elif not sentences[i]:
                report.skipped["no abstract"] += 1
                report.skipped_records.append(skipped_record(name, line, {"id": ids[i], "title": titles[i]}, "no abstract"))
                continue
            elif facets[i] is None or len(facets[i]) != len(sentences[i]):
                error = InputError(name, line, "facets", f"{len(facets[i] or [])} labels for {len(sentences[i])} sentences")
            elif sent_of[i] != len(sentences[i]):
                error = InputError(name, line, "vectors", f"{sent_of[i]} vectors for {len(sentences[i])} sentences")
            elif bad_dim[i]:
                error = InputError(name, line, "vectors",
                                   f"not every vector is {meta.dim}-d (the file's `esqbe` metadata says {meta.dim})")
            paper = None
            if error is None:
                try:
                    raw_meta = metas[i]
                    metadata = json.loads(raw_meta) if raw_meta else {}
                    if not isinstance(metadata, dict):
                        raise ValueError("not a JSON object")
                except (ValueError, RecursionError) as e:
                    error = InputError(name, line, "metadata", f"not a JSON object: {e}")
            if error is None:
                paper = Paper(ids[i], titles[i] or "", list(sentences[i]), list(facets[i]), metadata)
                problem = paper_problem(paper)  # null sentences or labels, unknown labels, NaN metadata, sizes
                if problem:
                    error = InputError(name, line, *problem)
            if error is None:
                start = int(inner_off[outer_off[i]])
                vectors = values[start : start + sent_of[i] * meta.dim].reshape(-1, meta.dim)
                norms = np.linalg.norm(vectors, axis=1)
                if not np.isfinite(vectors).all():
                    error = InputError(name, line, "vectors", "null, NaN or infinite values")
                elif not np.all(np.abs(norms - 1.0) <= NORM_TOLERANCE):
                    error = InputError(name, line, "vectors", f"not L2-normalised (norms {norms.min():.3f}..{norms.max():.3f})")
            if error is not None:
                if strict:
                    if out:
                        yield out
                    raise error
                report.errors.append(error)
                continue
            assert paper is not None  # made above when there was no error
            out.append(IndexedPaper(paper, vectors))
            report.yielded += 1
        row0 += n
        if out:
            yield out
