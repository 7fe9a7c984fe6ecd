"""Choosing the facet tagger by the ranking it gives (`esqbe train-tagger --select-on DIR`).

A user's library arrives without labels, so every paper's labels, the query's and the candidates', come from the
tagger: the ranking users get is the ranking with predicted labels. Each candidate of a list fixed in advance
(`CANDIDATES`) is trained on CSAbstruct train (epoch on CSAbstruct dev; never on any CSFCube label), then measured:
CSAbstruct dev macro-F1, the CPU share tagging takes of encoding (esqbe.tagger.cost), and CSFCube dev NDCG%20 / MAP
with every paper's labels predicted by it. `choose` applies the rule written down in docs/tagger.md before any
candidate was scored.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ParameterError
from ..settings.config import Settings

#: the candidates (name -> `train_tagger` keyword arguments over the shipped recipe), fixed before any was scored
CANDIDATES: dict[str, dict] = {
    "stride4": {},                                  # the shipped recipe: stride 4, mean pooling, 2 layers, 4 epochs
    "stride1": {"stride": 1},                       # every token (the tagger shipped before stride 4)
    "stride2": {"stride": 2},
    "attn": {"pool": "mean+attn", "epochs": 5},     # attention pooling beside the mean
    "seed1": {"seed": 1},                           # the shipped recipe, another seed: what a seed alone moves
}

#: a tagger may take at most this share of indexing time
MAX_COST = 0.15
#: candidates this close (NDCG%20 points) to the best are tied: 24 queries cannot tell them apart
TIE = 0.3
FACETS = ("background", "method", "result", "all")


@dataclass
class CandidateRow:
    name: str
    recipe: dict
    weights: str
    dev_macro_f1: float | None
    cost_share: float | None
    #: facet (and "all") -> {"NDCG%20": .., "MAP": ..} on CSFCube dev with --labels predict
    ranking: dict = field(default_factory=dict)
    temperature: float | None = None  # the one fitted on dev (recorded by training; applied only by --calibrate)
    dev_ece: tuple[float, float] | None = None  # before, after the temperature

    @property
    def ndcg(self) -> float:
        return float(self.ranking.get("all", {}).get("NDCG%20", float("nan")))

    @property
    def eligible(self) -> bool:
        return self.cost_share is None or self.cost_share <= MAX_COST


def choose(rows: list[CandidateRow]) -> CandidateRow:
    """The rule (docs/tagger.md): among candidates whose tagging cost is at most MAX_COST, the highest
    CSFCube dev NDCG%20 with predicted labels; candidates within TIE of it are tied, and among the tied the higher
    CSAbstruct dev macro-F1 wins, then the lower cost."""
    eligible = [r for r in rows if r.eligible and r.ranking]
    if not eligible:
        raise ParameterError(f"no candidate tags within {MAX_COST:.0%} of indexing time with a ranking measured")
    best = max(r.ndcg for r in eligible)
    tied = [r for r in eligible if r.ndcg >= best - TIE]
    return max(tied, key=lambda r: (r.dev_macro_f1 or 0.0, -(r.cost_share or 0.0)))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def measure(name: str, weights: Path, data_dir: str, settings: Settings, work: Path, *, sample=None,
            progress: bool = False, log=None) -> CandidateRow:
    """A candidate's row: its dev macro-F1 and temperature (from what training recorded), its tagging cost on
    `sample` (papers; skipped when None), its CSFCube ranking with predicted labels (an index of its own under
    `work`, keyed by the weights' digest, so other weights never reuse its labels)."""
    import torch

    from ..encode.loader import ModelSpec, load_encoder
    from ..tagger.cost import tagging_cost
    from ..tagger.runtime import FacetTagger
    from .evaluate import evaluate_csfcube

    meta = torch.load(weights, map_location="cpu", weights_only=True)["meta"]
    training, cal = meta.get("training", {}), meta.get("calibration") or {}
    cost = None
    if sample is not None:
        tagger = FacetTagger.load(weights, encoder=load_encoder(ModelSpec.from_settings(settings)))
        cost = tagging_cost(tagger, sample)["share"]
    result = evaluate_csfcube(data_dir, settings.replace(tagger=str(weights)), facets="predict",
                              index_path=str(work / f"csfcube-{name}-{_digest(weights)}"), progress=progress, log=log)
    split = "dev" if "dev" in result.splits else next(iter(result.splits))
    ranking = {f: {k: result.splits[split][f][k] for k in ("NDCG%20", "MAP")} for f in FACETS if f in result.splits[split]}
    return CandidateRow(name, CANDIDATES.get(name, {}), str(weights), training.get("dev_macro_f1"), cost, ranking,
                        cal.get("temperature"), (cal["ece_before"], cal["ece_after"]) if cal else None)


def select_tagger(work: str | Path, data_dir: str, train, dev, *, names=None, settings: Settings | None = None,
                  encoder=None, sample=None, progress: bool = True, log=None) -> dict:
    """Train (or reuse, when WORK/NAME.pt exists) every candidate, measure each, apply the rule. Returns
    {"rows": [...], "chosen": name, "rule": ...}; the chosen weights are WORK/<chosen>.pt."""
    from ..tagger.train import train_tagger

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    names = list(names or CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ParameterError(f"unknown candidate(s) {', '.join(unknown)}; candidates: {', '.join(CANDIDATES)}")
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    settings = settings or Settings()
    rows = []
    for name in names:
        weights = work / f"{name}.pt"
        if not weights.exists():
            log(f"candidate {name}: training {CANDIDATES[name] or 'the shipped recipe'}")
            train_tagger(train, dev, weights, encoder=encoder, progress=progress, **CANDIDATES[name])
        log(f"candidate {name}: measuring")
        rows.append(measure(name, weights, data_dir, settings, work, sample=sample, progress=progress, log=log))
    chosen = choose(rows)
    return {"rows": [{**asdict(r), "ndcg": r.ndcg, "eligible": r.eligible} for r in rows], "chosen": chosen.name,
            "weights": chosen.weights,
            "rule": f"cost <= {MAX_COST:.0%}; highest CSFCube dev NDCG%20 with predicted labels; within {TIE} tied: "
                    "higher CSAbstruct dev macro-F1, then lower cost"}


def format_choice(result: dict) -> str:
    """The candidates as the table docs/tagger.md keeps (markdown)."""
    head = ("| candidate | recipe | CSAbstruct dev macro-F1 | tagging cost (share of encode + tag CPU) | temperature "
            "(dev ECE before / after) | CSFCube dev `--labels predict` NDCG%20: bg / method / result / **all** | MAP all |")
    lines = [head, "|" + "---|" * 7]
    for r in result["rows"]:
        rk = r["ranking"]
        nd = " / ".join(f"{rk[f]['NDCG%20']:.2f}" for f in FACETS[:3] if f in rk)
        cost = "" if r["cost_share"] is None else f"{100 * r['cost_share']:.1f}%"
        temp = "" if r["temperature"] is None else f"{r['temperature']:.3f}" + (
            f" ({r['dev_ece'][0]:.2f} / {r['dev_ece'][1]:.2f})" if r["dev_ece"] else "")
        mark = " (chosen)" if r["name"] == result["chosen"] else ""
        lines.append(f"| {r['name']}{mark} | {r['recipe'] or 'shipped recipe'} | {r['dev_macro_f1']} | {cost} | {temp} | "
                     f"{nd} / **{rk.get('all', {}).get('NDCG%20', float('nan')):.2f}** | "
                     f"{rk.get('all', {}).get('MAP', float('nan')):.2f} |")
    return "\n".join(lines)


def install(result: dict, out: str | Path) -> Path:
    """Copy the chosen weights to `out`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result["weights"], out)
    return out
