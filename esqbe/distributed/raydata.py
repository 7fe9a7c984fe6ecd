"""Encoding on a Ray cluster with Ray Data: when one machine is not enough (`esqbe ray-encode`, `ray_encode`).

    ray start --head                       # on one machine; on the others: ray start --address HEAD:6379
    esqbe ray-encode papers/*.jsonl.gz --out encoded/ --address auto
    esqbe index encoded/*.parquet          # or --backend elasticsearch|opensearch: bulk, no model runs

The job is a Ray Data pipeline over the input files: read tasks (one per file, `esqbe.ingest.readers`:
every format esqbe reads, bad records reported as file:line: field: reason) stream papers to a pool of
encoder actors. Each actor loads the encoder (and the tagger, for papers without labels) once, the same
way every esqbe process does (`esqbe.encode.loader`, through `encoder_only`), and writes each batch it
is handed as one Parquet file of esqbe's encoded schema (`esqbe.ingest.encoded.EncodedWriter`, through
`Index.encode_into`: the code `esqbe encode` runs). The driver gets back one small row per file: its
path, its counts and the readers' reports.

Ray is optional (`pip install 'esqbe[ray]'`) and imported only when a job runs: `import esqbe` and the
CLI never load it. The input files and OUT must be one path on every node (a shared file system), and
esqbe must be installed on every node."""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import BackendError, EsqbeError, ParameterError, UserError
from ..index.reports import EncodeReport
from ..ingest.formats import FORMATS
from ..ingest.readers import ReadReport, check_source, read_papers
from ..settings.config import Settings, load_settings
from ..settings.table import FACET_MODES

RAY_HINT = "pip install 'esqbe[ray]'"
#: papers a read task hands on at once (a block of the stream between the readers and the encoders)
READ_CHUNK = 256
#: the environment a worker needs to load models as this process does (passed to the job's workers)
_WORKER_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "ESQBE_CACHE_DIR", "HF_HOME",
               "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")


class RayNotInstalledError(UserError):
    """Ray Data is not installed here: `pip install 'esqbe[ray]'` (distributed encoding is an optional extra)."""


class RayJobError(BackendError):
    """The Ray cluster cannot be reached, or the encoding job failed on it; the message says where and why."""


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401  (ray without its `data` extra has no Ray Data)
    except ImportError as e:
        raise RayNotInstalledError(f"distributed encoding needs Ray Data, which is not installed here ({e}): "
                                   f"{RAY_HINT}") from None
    return ray


# --- what runs on the cluster -------------------------------------------------------------------------
def _paper_json(p) -> str:
    return json.dumps({"paper_id": p.paper_id, "title": p.title, "sentences": p.sentences, "facets": p.facets,
                       "metadata": p.metadata}, ensure_ascii=False)


def _read_files(batch, format: str | None = None, chunk_size: int = READ_CHUNK) -> Iterator[Any]:
    """A read task: the papers of each source in `batch["source"]`, `chunk_size` at a time as rows
    {paper: JSON, note: null}, then one row {paper: null, note: JSON of the source's ReadReport}."""
    import pyarrow as pa

    def rows(papers: list[str], note: str | None = None):
        n = len(papers) if note is None else 1
        return pa.table({"paper": pa.array(papers if note is None else [None], pa.string()),
                         "note": pa.array([note] * n if note is not None else [None] * n, pa.string())})

    for source in batch.column("source").to_pylist():
        report = ReadReport()
        chunk: list[str] = []
        for paper in read_papers(source, format, report=report):
            chunk.append(_paper_json(paper))
            if len(chunk) >= chunk_size:
                yield rows(chunk)
                chunk = []
        if chunk:
            yield rows(chunk)
        yield rows([], json.dumps({"source": source, "read": report.read, "skipped": dict(report.skipped),
                                   "errors": [str(e) for e in report.errors] + list(report.repeated)}))


class _EncodeActor:
    """One encoder on one worker: loaded once, then each batch of papers it is handed becomes one Parquet
    file in `out` (returned as one row: path, encoded, tagged, and the readers' notes that came with it)."""

    def __init__(self, settings: Settings, out: str, facets: str, threads: int | None = None):
        from ..index.api import encoder_only

        if threads:  # the CPUs Ray gave this actor, not every core of the node
            import torch

            torch.set_num_threads(threads)
        self.index = encoder_only(settings=settings)
        self.meta = self.index.encoded_meta()  # loads the encoder now, once, not on the first batch
        self.out = Path(out)
        self.facets = facets

    def __call__(self, batch):
        import pyarrow as pa

        from ..domain import Paper
        from ..ingest.encoded import EncodedWriter

        papers = [Paper(**json.loads(x)) for x in batch.column("paper").to_pylist() if x is not None]
        notes = [x for x in batch.column("note").to_pylist() if x is not None]
        path, encoded, tagged = None, 0, 0
        if papers:
            target = self.out / f"papers-ray-{uuid.uuid4().hex[:16]}.parquet"
            with EncodedWriter(target, self.meta) as writer:
                report = self.index.encode_into(writer, papers, facets=self.facets)
            path, encoded, tagged = str(target), report.encoded, report.tagged
        return pa.table({"path": pa.array([path], pa.string()), "encoded": pa.array([encoded], pa.int64()),
                         "tagged": pa.array([tagged], pa.int64()), "notes": pa.array([json.dumps(notes)], pa.string())})


# --- the driver -----------------------------------------------------------------------------------------
def ray_encode(inputs: Sequence[str], out_dir: str, *, address: str | None = None, settings: Settings | None = None,
               config: str | None = None, format: str | None = None, facets: str | None = None,
               actors: int | None = None, cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0,
               papers_per_file: int = 1024, progress: bool = False, **overrides) -> EncodeReport:
    """Encode (and tag, per `facets`) the papers of `inputs` on a Ray cluster into Parquet files in `out_dir`
    (esqbe's encoded schema, `papers-ray-*.parquet`, at most `papers_per_file` papers each), to load with
    `esqbe index OUT/*.parquet` or `Index.index_files`.

    `address`: the cluster (`auto`: the one `ray start` made on this machine, `ray://HOST:10001`, ...); None
    starts a local one on this machine, unless this process is connected to one already (`ray.init` was
    called: then that cluster is used and left running). `actors` encoders (default: as many as the
    cluster's CPUs, or GPUs with `gpus_per_actor`, allow), each holding `cpus_per_actor` CPUs and
    `gpus_per_actor` GPUs. The model and its settings are `settings` (else the config file's, with
    `overrides`), as for `esqbe encode`. Returns an EncodeReport whose `path` is `out_dir` and `files` the
    files written; inputs that cannot be read and bad records are in its `errors`."""
    ray = _import_ray()
    settings = (settings or load_settings(config)).replace(**overrides)
    facets = facets or settings.facets
    if facets not in FACET_MODES:
        raise ParameterError(f"facets must be one of {', '.join(FACET_MODES)} (got {facets!r})")
    if format is not None and format not in FORMATS:
        raise ParameterError(f"format must be one of {', '.join(FORMATS)} (got {format!r})")
    if papers_per_file < 1 or cpus_per_actor < 0 or gpus_per_actor < 0 or (actors is not None and actors < 1):
        raise ParameterError("papers_per_file and actors must be >= 1, cpus_per_actor and gpus_per_actor >= 0 (got "
                             f"{papers_per_file}, {actors}, {cpus_per_actor}, {gpus_per_actor})")
    if settings.model:  # a typo in --model is found here, not on every worker
        from ..encode.identity import model_info

        model_info(settings.model)
    out = Path(out_dir)
    if out.is_dir() and (old := sorted(out.glob("*.parquet"))):
        raise ParameterError(f"{out} already holds {len(old)} Parquet file(s) ({old[0].name}, ...): a second run would "
                             "add to them; give an empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    report = EncodeReport(path=str(out))
    sources = []
    for source in inputs:
        problem = check_source(source)
        if problem is not None:
            report.errors.append(str(problem))
        elif str(source) == "-":
            report.errors.append("-: file: standard input cannot be read by the cluster's workers; give files")
        else:
            sources.append(os.path.abspath(source))
    start = time.perf_counter()
    if sources:
        _run(ray, sources, out, report, settings=settings, address=address, format=format, facets=facets,
             actors=actors, cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor,
             papers_per_file=papers_per_file, progress=progress)
    report.seconds = time.perf_counter() - start
    return report


def _run(ray, sources: list[str], out: Path, report: EncodeReport, *, settings: Settings, address: str | None,
         format: str | None, facets: str, actors: int | None, cpus_per_actor: float, gpus_per_actor: float,
         papers_per_file: int, progress: bool) -> None:
    """The job: connect (or start a local cluster), run the pipeline, add what came back to `report`."""
    started = not ray.is_initialized()
    if started:
        env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}
        try:
            ray.init(address=address, runtime_env={"env_vars": env} if env else None, log_to_driver=progress,
                     include_dashboard=False, configure_logging=progress)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayJobError(f"cannot connect to the Ray cluster at {address or 'a new local cluster'}: {e}") from None
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = progress
        context.print_on_execution_start = progress
        resources = ray.cluster_resources()
        if actors is None:
            have, per = (resources.get("GPU", 0), gpus_per_actor) if gpus_per_actor else (resources.get("CPU", 1), cpus_per_actor)
            actors = max(1, int(have // per)) if per else 1
        threads = max(1, int(cpus_per_actor)) if cpus_per_actor and not gpus_per_actor else None
        files = ray.data.from_items([{"source": s} for s in sources], override_num_blocks=len(sources))
        # reading is light next to encoding: read tasks take no CPU of their own, so a pool of encoders that
        # holds every CPU cannot starve them (at most `actors` of them run at once); their blocks are no longer
        # than an encoder's batch, so one file's papers are spread over the actors, not handed to one
        papers = files.map_batches(_read_files, batch_size=1, batch_format="pyarrow", num_cpus=0,
                                   fn_kwargs={"format": format, "chunk_size": min(READ_CHUNK, papers_per_file)},
                                   compute=ray.data.TaskPoolStrategy(size=actors))
        written = papers.map_batches(
            _EncodeActor, batch_size=papers_per_file, batch_format="pyarrow",
            fn_constructor_kwargs={"settings": settings, "out": str(out), "facets": facets, "threads": threads},
            compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus_per_actor,
            num_gpus=gpus_per_actor or None)
        for row in written.iter_rows():
            if row["path"]:
                report.files.append(row["path"])
            report.encoded += row["encoded"]
            report.tagged += row["tagged"]
            for note in map(json.loads, json.loads(row["notes"])):
                report.read += note["read"]
                report.skipped.update(note["skipped"])
                report.errors.extend(note["errors"])
    except EsqbeError:
        raise
    except Exception as e:  # Ray wraps what failed on a worker (RayTaskError, ActorDiedError, ...)
        cause = _cause(e)
        if isinstance(cause, EsqbeError):  # esqbe's own error on a worker (a model that cannot load, ...)
            raise cause from None
        if isinstance(e, ray.exceptions.RayError) or type(e).__module__.startswith("ray."):
            raise RayJobError(f"the Ray encoding job failed: {str(cause).strip().splitlines()[-1]}") from e
        raise
    finally:
        if started:
            ray.shutdown()
    report.files.sort()


def _cause(e: BaseException) -> BaseException:
    """The error a worker raised, under Ray's wrappers."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "cause", None) or e.__cause__
        if inner is None or inner is e:
            break
        e = inner
    return e


__all__ = ["ray_encode", "RayNotInstalledError", "RayJobError", "RAY_HINT"]
