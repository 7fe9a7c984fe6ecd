"""`esqbe engine install-reranker` / `uninstall-reranker`: esqbe's POST /rerank as the reranker of an Elasticsearch
or OpenSearch cluster, in one command (esqbe.index.rerank; the bodies: esqbe.backends.engines.reranker)."""
from __future__ import annotations

import json
import os

import click

from esqbe.core.redact import mask_urls
from esqbe.settings.generate import click_options, overrides_from_click

from .errors import handle_errors
from .options import config_option

_NAME = click.option("--name", default="esqbe-rerank", show_default=True,
                     help="The inference endpoint id (Elasticsearch), or the connector, model and search pipeline name "
                          "(OpenSearch).")


@click.group("engine")
def engine_group():
    """esqbe inside an Elasticsearch or OpenSearch cluster's own search (docs/engines.md)."""


def _settings(kw):
    from esqbe.settings.config import load_settings

    config = kw.pop("config", None)
    kw.pop("path", None)
    return load_settings(config).replace(**overrides_from_click(kw, "stats", ("where",)))


@engine_group.command("install-reranker")
@click.option("--server-url", required=True, help="Where the cluster reaches `esqbe serve`, e.g. http://esqbe:8000.")
@click.option("--server-token-file", type=click.Path(dir_okay=False, exists=True),
              help="The server's bearer token (its first line), stored in the cluster as a secret (default: $ESQBE_TOKEN).")
@click.option("--id-field", default="paper_id", show_default=True,
              help="OpenSearch: the document field holding the esqbe paper id, sent to esqbe for each hit.")
@_NAME
@click_options("stats", ("where",))
@config_option
@handle_errors
def install_reranker_cmd(server_url, server_token_file, id_field, name, **kw):
    """Make `esqbe serve` the cluster's reranker: Elasticsearch gets the inference endpoint rerank/NAME (the custom
    service); OpenSearch a connector, a deployed remote model and the search pipeline NAME. Running it again
    keeps what is the same and replaces the rest.

    \b
    esqbe engine install-reranker --backend elasticsearch --url http://localhost:9200 --index papers \\
                                  --server-url http://esqbe:8000
    """
    from esqbe.index.rerank import install_engine_reranker

    token = None
    if server_token_file:
        with open(server_token_file, encoding="utf-8") as f:
            token = f.readline().strip() or None
    token = token or os.environ.get("ESQBE_TOKEN") or None
    out = install_engine_reranker(_settings(kw), server_url, token=token, name=name, id_field=id_field)
    click.echo(mask_urls(json.dumps(out, indent=2)))  # a --server-url's credentials, if any, are not printed


@engine_group.command("uninstall-reranker")
@_NAME
@click_options("stats", ("where",))
@config_option
@handle_errors
def uninstall_reranker_cmd(name, **kw):
    """Remove what install-reranker created under NAME (parts already gone are no error)."""
    from esqbe.index.rerank import install_engine_reranker

    click.echo(json.dumps(install_engine_reranker(_settings(kw), "", name=name, remove=True), indent=2))
