"""The options the commands share, generated from the settings table (esqbe.settings.table: flags, types,
ranges, choices and help declared once), and opening the index from them."""
from __future__ import annotations

import click

# a torch-free module: --help stays instant
from esqbe.settings.generate import click_options, overrides_from_click, parse_params

FACET_CHOICES = ("background", "method", "result")

#: the settings groups that say how an index is opened (the rest are a command's own: querying)
OPEN_GROUPS = ("where", "encoding", "indexing")

config_option = click.option("--config", "config", type=click.Path(dir_okay=False),
                             help="YAML settings file (default: $ESQBE_CONFIG or ./esqbe.yaml).")

_parse_params = parse_params  # `--param KEY=VALUE` pairs (cite's and clscisumm's matcher options too)

__all__ = ["FACET_CHOICES", "click_options", "config_option", "overrides_from_click", "parse_params", "_open",
           "open_settings"]


def _open(kw, command: str, *, create=True):
    """Open the index the command's options (popped from `kw`) and the config name."""
    import esqbe

    return esqbe.open_index(settings=open_settings(kw, command), create=create)


def open_settings(kw, command: str):
    """The settings the command's options (popped from `kw`: the config name, the path, the where/encoding/indexing
    flags) open the index with, as `esqbe.open_index` makes them."""
    from esqbe.settings.config import load_settings

    config = kw.pop("config", None)
    path = kw.pop("path", None)
    overrides = overrides_from_click(kw, command, OPEN_GROUPS)
    return load_settings(config).replace(path=path, **overrides)
