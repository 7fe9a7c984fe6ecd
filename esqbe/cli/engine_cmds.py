"""`esqbe engine install-reranker` / `uninstall-reranker`: esqbe's POST /rerank as the reranker of an Elasticsearch
or OpenSearch cluster, in one command (esqbe.index.rerank; the bodies: esqbe.backends.engines.reranker)."""
from __future__ import annotations

import json
import os

import click

from esqbe.core.redact import mask_urls
from esqbe.settings.generate import LazyChoice, overrides_from_click

from .errors import handle_errors
from .options import config_option

_NAME = click.option("--name", default="esqbe-rerank", show_default=True,
                     help="The inference endpoint id (Elasticsearch), or the connector, model and search pipeline name "
                          "(OpenSearch).")


@click.group("engine")
def engine_group():
    """esqbe inside an Elasticsearch or OpenSearch cluster's own search (docs/engines.md)."""


def _engine_options(fn):
    """The cluster's options only (URL, index, credentials; `--backend` elasticsearch or opensearch): the settings
    table's `where` group without the embedded backend's `--path`, plus what every engine command takes."""
    from esqbe.settings.generate import click_option, command_settings

    for s in reversed([s for s in command_settings("stats", ("where",)) if s.name not in ("backend", "path")]):
        fn = click_option(s)(fn)
    fn = click.option("--backend", type=LazyChoice(["elasticsearch", "opensearch"]),
                      help="The cluster's engine. (env ESQBE_BACKEND)")(fn)
    fn = click.option("--connect-timeout", type=click.FloatRange(0.1, 120), default=5.0, show_default=True,
                      help="Seconds to wait for the cluster to accept a connection.")(fn)
    fn = click.option("--dry-run", is_flag=True,
                      help="Send nothing: print every request, in order, with when it is sent (the token redacted).")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="The outcome as JSON (for scripts).")(fn)
    return fn


def _settings(kw):
    from esqbe.settings.config import load_settings

    config = kw.pop("config", None)
    settings = load_settings(config).replace(**overrides_from_click(kw, "stats", ("where",)))
    return settings


def _emit(out: dict, as_json: bool) -> None:
    from esqbe.index.rerank import reranker_summary

    # a --server-url's or --url's credentials, if any, are not printed
    click.echo(mask_urls(json.dumps(out, indent=2, ensure_ascii=False) if as_json else reranker_summary(out)))


@engine_group.command("install-reranker")
@click.option("--server-url", required=True, help="Where the cluster reaches `esqbe serve`, e.g. http://esqbe:8000.")
@click.option("--server-token-file", type=click.Path(dir_okay=False, exists=True),
              help="The server's bearer token (its first line), stored in the cluster as a secret (default: $ESQBE_TOKEN).")
@click.option("--id-field", default="paper_id", show_default=True,
              help="OpenSearch: the document field holding the esqbe paper id, sent to esqbe for each hit.")
@_NAME
@_engine_options
@config_option
@handle_errors
def install_reranker_cmd(server_url, server_token_file, id_field, name, dry_run, as_json, connect_timeout, **kw):
    """Make `esqbe serve` the cluster's reranker: Elasticsearch gets the inference endpoint rerank/NAME (the custom
    service); OpenSearch a connector, a deployed remote model and the search pipeline NAME. Running it again
    keeps what is the same and replaces the rest. The index must exist and be esqbe's.

    \b
    esqbe engine install-reranker --backend elasticsearch --url http://localhost:9200 --index papers \\
                                  --server-url http://esqbe:8000 --dry-run
    """
    from esqbe.index.rerank import install_engine_reranker

    token = None
    if server_token_file:
        with open(server_token_file, encoding="utf-8") as f:
            token = f.readline().strip() or None
    token = token or os.environ.get("ESQBE_TOKEN") or None
    _emit(install_engine_reranker(_settings(kw), server_url, token=token, name=name, id_field=id_field,
                                  dry_run=dry_run, connect_timeout=connect_timeout), as_json)


@engine_group.command("uninstall-reranker")
@_NAME
@_engine_options
@config_option
@handle_errors
def uninstall_reranker_cmd(name, dry_run, as_json, connect_timeout, **kw):
    """Remove what install-reranker created under NAME (parts already gone are no error)."""
    from esqbe.index.rerank import install_engine_reranker

    _emit(install_engine_reranker(_settings(kw), "", name=name, remove=True, dry_run=dry_run,
                                  connect_timeout=connect_timeout), as_json)
