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
           "open_settings", "text_or_file", "query_text_or_file"]


def text_or_file(text: str | None, text_file) -> str | None:
    """`--text` or `--file` (not both): the file read up to MAX_QUERY_CHARS characters and refused past them without
    reading the rest (`--file /dev/zero` ends at once)."""
    from esqbe.core.limits import MAX_QUERY_CHARS
    from esqbe.query.results import QueryTooLargeError

    if text_file is None:
        return text
    if text is not None:
        raise click.UsageError("give --text or --file, not both")
    read = text_file.read(MAX_QUERY_CHARS + 1)
    if len(read) > MAX_QUERY_CHARS:
        raise QueryTooLargeError(f"--file {text_file.name}: more than {MAX_QUERY_CHARS} characters; a query text has "
                                 f"at most {MAX_QUERY_CHARS}")
    return read


def query_text_or_file(text: str | None, text_file) -> str | None:
    """`text_or_file`, checked as every query's free text is (esqbe.query.search.query_texts: characters, then its
    sentences counted whole) before the index is opened or the model loaded."""
    from esqbe.query.search import query_sentences

    text = text_or_file(text, text_file)
    if text is not None:
        query_sentences(text)
    return text


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
