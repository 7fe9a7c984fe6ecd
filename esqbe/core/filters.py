"""Metadata filters: a small grammar, a structured form, and their meaning on every backend.

A filter is a list of conditions, all of which must hold (AND). Each condition names a stored
metadata key, an operator and a value:

    year>=2019            venue in (ACL, EMNLP)        author!="Jane Doe"
    doi exists            not exists open_access_url   fields_of_study not in (Medicine)

Operators: `=` `!=` `<` `<=` `>` `>=` `in (a, b, ...)` `not in (a, b, ...)` `exists` `not exists`
(`KEY exists` / `exists KEY`), and for text `~=` (equal, ignoring case: `venue~=arxiv`) and `^=` (starts
with, ignoring case: `author^=sugi`). Keys are dotted paths into the metadata (`external_ids.doi`,
`authors.name`); `author` is short for `authors.name` and `author_id` for `authors.id`. Values are
bare words/numbers or quoted strings (`"..."` or `'...'`, backslash escapes the quote); quotes are
only needed for spaces, commas, parentheses or quotes, they never change the type.

Meaning (the same on the embedded backend, Elasticsearch and OpenSearch):

- A key's values are the scalars at its path, lists flattened: `authors.name` of a paper with three
  authors has three values (an object at the path has no value of its own; `exists` counts any value
  inside it). Booleans are the strings `true` / `false`, `null` is absent.
- A value compares with a stored number as a number (if it reads as one) and with a stored string
  as the string (case-sensitive): `year=2019` matches the number 2019 and the string "2019";
  `publication_date>=2019-06` compares strings (ISO dates sort as dates).
- `=`, `<`, `<=`, `>`, `>=`, `in`: at least one value satisfies it; a paper without the key never
  matches. `!=` and `not in` are their negations, so they DO match papers without the key
  (`author!=X` keeps papers with no authors). `exists`: at least one value.

Structured form (Python API, JSON for the HTTP API): a list of `{"key": ..., "op": ..., "value": ...}`
dicts (value a list for `in` / `not in`, absent for `exists`), or the strings above; see
`coerce_filters`. Engines get a `bool` filter from `to_query_dsl`; the embedded backend evaluates
`matches` over the papers' stored metadata before ranking.
"""
from __future__ import annotations

import bisect
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UserError
from .limits import MAX_FILTER_BYTES, MAX_FILTER_VALUES

OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "exists", "not exists", "~=", "^=")
#: the text operators: `~=` equal ignoring case, `^=` starts with, ignoring case (text values only)
TEXT_OPS = ("~=", "^=")
RANGE_OPS = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}
#: short names users type -> the metadata path they mean
KEY_ALIASES = {"author": "authors.name", "author_id": "authors.id"}
#: engine documents: every metadata leaf under one of these, split by type (see flatten_for_engine)
ENGINE_KEYWORD_ROOT = "meta_kw"
ENGINE_NUMBER_ROOT = "meta_num"
#: metadata keys that are not filter fields (the tagger's soft labels: a matrix of floats per paper; a BibTeX entry as
#: written, its LaTeX and all, esqbe.ingest.library.AS_WRITTEN: its decoded fields are the ones to filter by)
UNFILTERED_METADATA_KEYS = frozenset({"facet_probs", "bibtex"})

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_KEY = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*$")
_SYNTAX = (
    "expected KEY OP VALUE with OP one of = != < <= > >= ~= (any case) ^= (prefix, any case), "
    "KEY in (V1, V2, ...), KEY not in (...), KEY exists or KEY not exists; e.g. year>=2019, venue in (ACL, EMNLP), doi exists"
)


class FilterError(UserError, ValueError):
    """A filter that cannot be read; the message says where and what was expected."""


@dataclass(frozen=True)
class Condition:
    """One condition: `value` is a scalar for comparisons, a tuple for in/not in, None for exists."""

    key: str
    op: str
    value: Any = None

    def __post_init__(self):
        if self.op not in OPERATORS:
            raise FilterError(f"filter on {self.key!r}: unknown operator {self.op!r} (one of {', '.join(OPERATORS)})")
        if not isinstance(self.key, str) or not _KEY.match(self.key):
            raise FilterError(f"filter key {self.key!r} is not a metadata key (letters, digits, _ and -, dotted paths)")
        if self.op in ("in", "not in"):
            if isinstance(self.value, (str, bytes)) or not isinstance(self.value, Iterable):
                raise FilterError(f"filter {self.key} {self.op}: expected a list of values, got {self.value!r}")
            values = tuple(self.value)
            if not values:
                raise FilterError(f"filter {self.key} {self.op} (): the list is empty")
            if len(values) > MAX_FILTER_VALUES:  # counted before anything is done with the values
                raise FilterError(f"filter {self.key} {self.op}: {len(values)} values; at most {MAX_FILTER_VALUES} "
                                  "(filter_max_values)")
            for v in values:
                _check_scalar(self.key, self.op, v)
            object.__setattr__(self, "value", values)
            check_value_list(self)
        elif self.op in ("exists", "not exists"):
            if self.value is not None:
                raise FilterError(f"filter {self.key} {self.op}: takes no value (got {self.value!r})")
        else:
            _check_scalar(self.key, self.op, self.value)

    @property
    def path(self) -> str:
        """The metadata path this condition looks at (aliases resolved)."""
        return KEY_ALIASES.get(self.key, self.key)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"key": self.key, "op": self.op}
        if self.value is not None:
            d["value"] = list(self.value) if isinstance(self.value, tuple) else self.value
        return d

    def __str__(self) -> str:
        if self.op in ("exists", "not exists"):
            return f"{self.key} {self.op}"
        if self.op in ("in", "not in"):
            return f"{self.key} {self.op} ({', '.join(_show(v) for v in self.value)})"
        return f"{self.key}{self.op}{_show(self.value)}"

    @classmethod
    def from_dict(cls, d: dict) -> Condition:
        if not isinstance(d, dict):
            raise FilterError(f"a structured filter is a {{'key', 'op', 'value'}} object, got {d!r}")
        unknown = set(d) - {"key", "op", "value"}
        if unknown:
            raise FilterError(f"filter {d!r}: unknown field(s) {', '.join(sorted(unknown))} (expected key, op, value)")
        if "key" not in d or "op" not in d:
            raise FilterError(f"filter {d!r}: needs 'key' and 'op'")
        op = " ".join(str(d["op"]).lower().split())
        if op == "==":
            op = "="
        return cls(d["key"], op, d.get("value"))


@dataclass(frozen=True)
class MetadataFilter:
    """What a first stage is restricted to: metadata conditions (all must hold) and, on engine
    backends, the user's own query DSL clause (`engine_query`, ANDed)."""

    conditions: tuple[Condition, ...] = ()
    engine_query: dict | None = field(default=None, compare=False, hash=False)

    def __bool__(self) -> bool:
        return bool(self.conditions) or self.engine_query is not None

    def matches(self, metadata: dict) -> bool:
        return matches(metadata, self.conditions)


def check_value_list(c: Condition, max_values: int = MAX_FILTER_VALUES, max_bytes: int = MAX_FILTER_BYTES) -> None:
    """FilterError where an `in` / `not in` list holds more than `max_values` values or more than `max_bytes` bytes
    of text (UTF-8, all values together): what one filter may make a query examine (settings filter_max_values,
    filter_max_bytes)."""
    if not isinstance(c.value, tuple):
        return
    if len(c.value) > max_values:
        raise FilterError(f"filter {c.key} {c.op}: {len(c.value)} values; at most {max_values} (filter_max_values)")
    size = sum(len(_as_text(v).encode("utf-8", "surrogatepass")) for v in c.value)
    if size > max_bytes:
        raise FilterError(f"filter {c.key} {c.op}: {size} bytes of values; at most {max_bytes} (filter_max_bytes)")


def _check_scalar(key: str, op: str, value) -> None:
    if value is None or isinstance(value, (dict, list, tuple)):
        raise FilterError(f"filter {key} {op}: expected a string, number or boolean value, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(f"filter {key} {op}: {value!r} is not a finite number")


def _show(v) -> str:
    s = v if isinstance(v, str) else _as_text(v)
    return s if re.match(r"^[\w.:/+\-]+$", s) else '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------------------- the grammar


class _Lexer:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def error(self, what: str) -> FilterError:
        return FilterError(f"bad filter {self.text!r} at column {self.pos + 1}: {what}; {_SYNTAX}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def peek_word(self) -> str:
        self.skip()
        m = re.compile(r"[A-Za-z_][\w.\-]*").match(self.text, self.pos)
        return m.group(0) if m else ""

    def word(self, what: str = "a key") -> str:
        w = self.peek_word()
        if not w:
            raise self.error(f"expected {what}")
        self.pos += len(w)
        return w

    def operator(self) -> str | None:
        self.skip()
        for op in ("!=", "<=", ">=", "==", "~=", "^=", "=", "<", ">"):
            if self.text.startswith(op, self.pos):
                self.pos += len(op)
                return "=" if op == "==" else op
        return None

    def value(self, stop: str = "") -> str:
        """A quoted string or a bare run up to whitespace-trimmed end / a stop character."""
        self.skip()
        if self.pos >= len(self.text):
            raise self.error("expected a value")
        quote = self.text[self.pos]
        if quote in "\"'":
            out, i = [], self.pos + 1
            while i < len(self.text):
                c = self.text[i]
                if c == "\\" and i + 1 < len(self.text):
                    out.append(self.text[i + 1])
                    i += 2
                    continue
                if c == quote:
                    self.pos = i + 1
                    return "".join(out)
                out.append(c)
                i += 1
            raise self.error(f"unterminated {quote}-quoted value")
        i = self.pos
        while i < len(self.text) and self.text[i] not in stop and self.text[i] not in "\"'":
            i += 1
        raw = self.text[self.pos : i].strip()
        if not raw:
            raise self.error("expected a value")
        self.pos = i
        return raw


def parse_filter(text: str) -> Condition:
    """One condition from the grammar (see the module docstring); FilterError says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise FilterError(f"empty filter; {_SYNTAX}")
    lex = _Lexer(text)
    m = re.match(r"^\s*(not\s+)?exists\s+([^\s=!<>()]+)\s*$", text, re.I)
    if m:
        if not _KEY.match(m.group(2)):
            raise lex.error(f"{m.group(2)!r} is not a metadata key")
        return Condition(m.group(2), "not exists" if m.group(1) else "exists")
    key = lex.word("a metadata key (e.g. year, venue, author)")
    if not _KEY.match(key):
        raise lex.error(f"{key!r} is not a metadata key")
    op = lex.operator()
    if op is not None:
        lex.skip()
        if lex.pos < len(text) and text[lex.pos] in "=<>!~^":
            raise lex.error(f"unexpected {text[lex.pos]!r} after operator {op!r}")
        lex.skip()
        start = lex.pos
        raw = lex.value()
        if not lex.at_end():
            raise lex.error("unexpected text after the value (quote values holding spaces or quotes)")
        _one_word(lex, op, raw, start)
        return Condition(key, op, raw)
    word = lex.peek_word().lower()
    if word == "not":
        lex.word()
        word = "not " + lex.word("'in' or 'exists' after 'not'").lower()
    elif word in ("in", "exists"):
        lex.word()
    else:
        raise lex.error(f"expected an operator after {key!r}")
    if word in ("exists", "not exists"):
        if not lex.at_end():
            raise lex.error(f"'{word}' takes no value")
        return Condition(key, word)
    if word not in ("in", "not in"):
        raise lex.error(f"unknown operator {word!r}")
    lex.skip()
    if lex.pos >= len(text) or text[lex.pos] != "(":
        raise lex.error(f"expected '(' after '{word}' (e.g. {key} {word} (A, B))")
    lex.pos += 1
    values = []
    while True:
        lex.skip()
        start = lex.pos
        values.append(lex.value(stop=",)"))
        end = lex.pos
        _one_word(lex, "=", values[-1], start)
        lex.pos = end
        lex.skip()
        if lex.pos >= len(text):
            raise lex.error("missing ')'")
        c = text[lex.pos]
        lex.pos += 1
        if c == ")":
            break
        if c != ",":
            raise lex.error("expected ',' or ')' between values")
    if not lex.at_end():
        raise lex.error("unexpected text after ')'")
    return Condition(key, word, tuple(values))


def _one_word(lex: _Lexer, op: str, raw: str, start: int) -> None:
    """A bare value of several words is one text value (`collection=Chapter 2: Methods`), except where it cannot be:
    after an order operator (`<` `<=` `>` `>=`) or when it begins with a number (`year>=20 15`), a second word is a
    stray token, refused at its column."""
    if lex.text[start] in "\"'":
        return
    words = raw.split()
    if len(words) < 2 or (op not in RANGE_OPS and not _NUMBER.match(words[0])):
        return
    lex.pos = lex.text.index(words[1], start + len(words[0]))
    why = "a number is one word" if _NUMBER.match(words[0]) else f"{op!r} compares with one word"
    raise lex.error(f"unexpected {words[1]!r} after the value {words[0]!r} ({why}; a value that holds spaces is "
                    f"quoted: \"{raw}\")")


def coerce_filters(filters, *, max_values: int = MAX_FILTER_VALUES, max_bytes: int = MAX_FILTER_BYTES
                   ) -> tuple[Condition, ...]:
    """The API's filter argument in any of its forms -> conditions, each value list within `max_values` values
    and `max_bytes` bytes (`check_value_list`).

    Accepts None, a grammar string, a `{"key", "op", "value"}` dict, a Condition, or a list of any
    of these (all must hold). JSON-friendly both ways: `[c.to_dict() for c in conditions]`.
    """
    if filters is None:
        return ()
    if isinstance(filters, MetadataFilter):
        return filters.conditions
    if isinstance(filters, (str, dict, Condition)):
        filters = [filters]
    if not isinstance(filters, (list, tuple)):
        raise FilterError("filters must be a string, a {'key', 'op', 'value'} object or a list of them, "
                          f"got {type(filters).__name__}")
    out = []
    for item in filters:
        if isinstance(item, Condition):
            out.append(item)
        elif isinstance(item, str):
            out.append(parse_filter(item))
        elif isinstance(item, dict):
            out.append(Condition.from_dict(item))
        else:
            raise FilterError(f"a filter is a string or a {{'key', 'op', 'value'}} object, got {item!r}")
        check_value_list(out[-1], max_values, max_bytes)
    return tuple(out)


# ---------------------------------------------------------------------------- meaning


def _as_number(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and _NUMBER.match(v.strip()):
        return float(v)
    return None


def _as_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


def leaf_values(metadata: dict, path: str, deep: bool = False) -> list:
    """The scalars at `path` (dotted; lists flattened at any level); None left out. With `deep`, also
    every scalar inside objects found there (what `exists` counts, as the engines do for object fields). A key of
    UNFILTERED_METADATA_KEYS has none, as it has no column or engine field."""
    if path.split(".", 1)[0] in UNFILTERED_METADATA_KEYS:
        return []
    current: list = [metadata]
    for part in path.split("."):
        nxt = []
        for node in current:
            for item in node if isinstance(node, list) else [node]:
                if isinstance(item, dict) and part in item:
                    nxt.append(item[part])
        current = nxt
    out = []

    def walk(x):
        if isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            if deep:
                for y in x.values():
                    walk(y)
        elif x is not None:
            out.append(x)

    for x in current:
        walk(x)
    return out


def _split(values: list) -> tuple[list[float], list[str]]:
    """Stored leaves by type: numbers compare as numbers, everything else (bools as true/false) as text."""
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    texts = [_as_text(v) for v in values if isinstance(v, (str, bool))]
    return nums, texts


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def condition_matches(metadata: dict, c: Condition) -> bool:
    if c.op in ("exists", "not exists"):
        return bool(leaf_values(metadata or {}, c.path, deep=True)) == (c.op == "exists")
    values = leaf_values(metadata or {}, c.path)
    nums, texts = _split(values)
    if c.op in TEXT_OPS:
        return any(text_op_matches(c.op, t, _as_text(c.value)) for t in texts)
    if c.op in ("=", "!=", "in", "not in"):
        wanted = [c.value] if c.op in ("=", "!=") else list(c.value)
        wn = {n for n in (_as_number(v) for v in wanted) if n is not None}
        wt = {_as_text(v) for v in wanted}
        hit = any(n in wn for n in nums) or any(t in wt for t in texts)
        return hit if c.op in ("=", "in") else not hit
    cmp = _CMP[c.op]
    n = _as_number(c.value)
    t = _as_text(c.value)
    return (n is not None and any(cmp(x, n) for x in nums)) or any(cmp(x, t) for x in texts)


def fold(text: str) -> str:
    """Text as people compare it: case and accents ignored (`García-Mateo` and `garcia-mateo` are one)."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def text_op_matches(op: str, stored: str, value: str) -> bool:
    """`~=` / `^=` on one stored text, case and accents folded on both sides (`fold`; the engines fold case only)."""
    return fold(stored) == fold(value) if op == "~=" else fold(stored).startswith(fold(value))


def matches(metadata: dict, conditions: Sequence[Condition]) -> bool:
    """Whether one paper's metadata satisfies every condition."""
    return all(condition_matches(metadata, c) for c in conditions)


def allowed_ids(rows: Iterable[tuple[str, dict]], conditions: Sequence[Condition]) -> set[str]:
    """Paper ids among (paper id, metadata) rows that satisfy every condition."""
    return {pid for pid, meta in rows if matches(meta, conditions)}


class MetadataColumns:
    """Every paper's metadata as columns (per dotted path: paper rows and values, numbers and text
    apart, as `flatten_for_engine` splits them), so a filter is a few numpy operations per query
    instead of a Python loop over papers. Same meaning as `condition_matches` (tests check both)."""

    def __init__(self, ids: Sequence[str], metadatas: Iterable[dict]):
        self.ids = list(ids)
        num: dict[str, tuple[list[int], list[float]]] = {}
        kw: dict[str, tuple[list[int], list[str]]] = {}
        for row, meta in enumerate(metadatas):
            texts, numbers = flatten_for_engine(meta)
            for path, values in texts.items():
                rows, vals = kw.setdefault(path, ([], []))
                rows.extend([row] * len(values))
                vals.extend(values)
            for path, nums in numbers.items():
                rows, numbers_of = num.setdefault(path, ([], []))
                rows.extend([row] * len(nums))
                numbers_of.extend(nums)
        self.num = {p: (np.asarray(r, dtype=np.int64), np.asarray(v, dtype=np.float64)) for p, (r, v) in num.items()}
        self.kw = {p: (np.asarray(r, dtype=np.int64), np.asarray(v, dtype=object)) for p, (r, v) in kw.items()}
        self._kw_index: dict[str, dict[str, np.ndarray]] = {}
        self._kw_sorted: dict[str, list[str]] = {}
        self._kw_folded: dict[str, list[tuple[str, np.ndarray]]] = {}
        self._kw_distinct: dict[str, list[tuple[str, str]]] = {}

    def _folded(self, path: str) -> list[tuple[str, np.ndarray]]:
        """(a distinct text value at `path` folded, its rows), built once per path."""
        if path not in self._kw_folded:
            self._text_rows(path, "")  # builds the value index
            self._kw_folded[path] = [(fold(v), rows) for v, rows in self._kw_index[path].items()]
        return self._kw_folded[path]

    def distinct_texts(self, path: str) -> list[tuple[str, str]]:
        """(each distinct text value at `path`, folded), sorted by value, built once per path: what the near-value
        search of a value no paper has reads (esqbe.core.filter_check)."""
        if path not in self._kw_distinct:
            folded = self._folded(path)
            self._kw_distinct[path] = sorted(zip(self._kw_index[path], (f for f, _ in folded)))
        return self._kw_distinct[path]

    def __len__(self) -> int:
        return len(self.ids)

    def _text_rows(self, path: str, value: str) -> np.ndarray:
        index = self._kw_index.get(path)
        if index is None:
            rows, vals = self.kw[path]
            groups: dict[str, list[int]] = {}
            for r, v in zip(rows.tolist(), vals.tolist()):
                groups.setdefault(v, []).append(r)
            index = self._kw_index[path] = {v: np.asarray(r, dtype=np.int64) for v, r in groups.items()}
        return index.get(value, np.zeros(0, dtype=np.int64))

    def mask(self, c: Condition) -> np.ndarray:
        """Boolean row mask of the papers satisfying one condition."""
        out = np.zeros(len(self.ids), dtype=bool)
        path = c.path
        if c.op in ("exists", "not exists"):
            prefix = path + "."
            for cols in (self.num, self.kw):
                for p, (rows, _) in cols.items():
                    if p == path or p.startswith(prefix):
                        out[rows] = True
            return out if c.op == "exists" else ~out
        if c.op in TEXT_OPS:
            if path in self.kw:
                value = fold(_as_text(c.value))
                for folded, rows in self._folded(path):  # text_op_matches, each stored value folded once per index
                    if (folded == value) if c.op == "~=" else folded.startswith(value):
                        out[rows] = True
            return out
        if c.op in ("=", "!=", "in", "not in"):
            wanted = [c.value] if c.op in ("=", "!=") else list(c.value)
            if path in self.num:
                rows, vals = self.num[path]
                wn = [n for n in (_as_number(v) for v in wanted) if n is not None]
                if wn:
                    out[rows[np.isin(vals, wn)]] = True
            if path in self.kw:
                for t in {_as_text(v) for v in wanted}:
                    out[self._text_rows(path, t)] = True
            return out if c.op in ("=", "in") else ~out
        cmp = _CMP[c.op]
        n = _as_number(c.value)
        if n is not None and path in self.num:
            rows, vals = self.num[path]
            out[rows[cmp(vals, n)]] = True
        if path in self.kw:
            self._text_rows(path, "")  # builds the value index
            keys = self._kw_sorted.get(path)
            if keys is None:
                keys = self._kw_sorted[path] = sorted(self._kw_index[path])
            t = _as_text(c.value)
            lo, hi = {"<": (0, bisect.bisect_left(keys, t)), "<=": (0, bisect.bisect_right(keys, t)),
                      ">": (bisect.bisect_right(keys, t), len(keys)), ">=": (bisect.bisect_left(keys, t), len(keys))}[c.op]
            if hi > lo:
                out[np.concatenate([self._kw_index[path][k] for k in keys[lo:hi]])] = True
        return out

    def allowed(self, conditions: Sequence[Condition]) -> frozenset[str]:
        keep = np.ones(len(self.ids), dtype=bool)
        for c in conditions:
            keep &= self.mask(c)
        return frozenset(self.ids[i] for i in np.flatnonzero(keep))

    def ids_where(self, path: str, test: Callable[[str], bool]) -> list[str]:
        """Ids of the papers with a text value at `path` (or a path under it: `external_ids`) whose folded form
        (`fold`) passes `test`, in the index's order; `test` runs once per distinct value."""
        prefix = path + "."
        keep = np.zeros(len(self.ids), dtype=bool)
        for p in list(self.kw):
            if p == path or p.startswith(prefix):
                for folded, rows in self._folded(p):
                    if test(folded):
                        keep[rows] = True
        return [self.ids[i] for i in np.flatnonzero(keep)]


# ---------------------------------------------------------------------------- engines


def flatten_for_engine(metadata: dict) -> tuple[dict[str, list[str]], dict[str, list[float]]]:
    """The metadata's leaves by dotted path, split into text (keyword) and number (double) fields.

    Engine documents carry them as `meta_kw.<path>` / `meta_num.<path>`, so a key holding numbers in
    one paper and strings in another never conflicts in the mapping, and `to_query_dsl` can ask each
    side exactly what `condition_matches` asks in Python.
    """
    kw: dict[str, list[str]] = {}
    num: dict[str, list[float]] = {}

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                if not path and k in UNFILTERED_METADATA_KEYS:
                    continue
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(x, list):
            for v in x:
                walk(v, path)
        elif x is None or not path:
            return
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            if math.isfinite(float(x)):
                num.setdefault(path, []).append(float(x))
        else:
            kw.setdefault(path, []).append(_as_text(x))

    walk(metadata or {}, "")
    return kw, num


#: (path) -> [(field, "num" | "kw")] the engine fields to ask for one metadata path
FieldResolver = Callable[[str], list[tuple[str, str]]]


def esqbe_fields(path: str) -> list[tuple[str, str]]:
    """Where an esqbe-made engine index keeps a metadata path (see flatten_for_engine)."""
    return [(f"{ENGINE_NUMBER_ROOT}.{path}", "num"), (f"{ENGINE_KEYWORD_ROOT}.{path}", "kw")]


def _any(clauses: list[dict]) -> dict:
    if len(clauses) == 1:
        return clauses[0]
    return {"bool": {"should": clauses, "minimum_should_match": 1}}


def _not(clause: dict) -> dict:
    return {"bool": {"must_not": [clause]}}


def condition_dsl(c: Condition, resolve: FieldResolver = esqbe_fields) -> dict:
    """One condition as an engine query clause with the same meaning as `condition_matches`."""
    fields = resolve(c.path)
    if c.op in ("exists", "not exists"):
        clause = _any([{"exists": {"field": f}} for f, _ in fields])
        return clause if c.op == "exists" else _not(clause)
    if c.op in TEXT_OPS:  # keyword fields only; the engines lower-case both sides
        kind_of = "term" if c.op == "~=" else "prefix"
        text_clauses = [{kind_of: {f: {"value": _as_text(c.value), "case_insensitive": True}}}
                        for f, kind in fields if kind == "kw"]
        return _any(text_clauses) if text_clauses else {"bool": {"must_not": [{"match_all": {}}]}}
    if c.op in ("=", "!=", "in", "not in"):
        wanted = [c.value] if c.op in ("=", "!=") else list(c.value)
        clauses: list[dict] = []
        for f, kind in fields:
            vals: list[Any]
            if kind == "num":
                vals = sorted({n for n in (_as_number(v) for v in wanted) if n is not None})
                vals = [int(v) if v.is_integer() else v for v in vals]
            else:
                vals = sorted({_as_text(v) for v in wanted})
            if vals:
                clauses.append({"term": {f: vals[0]}} if len(vals) == 1 else {"terms": {f: vals}})
        clause = _any(clauses) if clauses else {"bool": {"must_not": [{"match_all": {}}]}}
        return clause if c.op in ("=", "in") else _not(clause)
    bound = RANGE_OPS[c.op]
    clauses = []
    for f, kind in fields:
        if kind == "num":
            n = _as_number(c.value)
            if n is not None:
                clauses.append({"range": {f: {bound: int(n) if n.is_integer() else n}}})
        else:
            clauses.append({"range": {f: {bound: _as_text(c.value)}}})
    return _any(clauses) if clauses else {"bool": {"must_not": [{"match_all": {}}]}}


def to_query_dsl(flt: MetadataFilter | Sequence[Condition] | None, resolve: FieldResolver = esqbe_fields) -> list[dict]:
    """Filter clauses (for `bool.filter` or a kNN `filter`): one per condition, plus the user's engine query."""
    if flt is None:
        return []
    conditions = flt.conditions if isinstance(flt, MetadataFilter) else tuple(flt)
    out = [condition_dsl(c, resolve) for c in conditions]
    if isinstance(flt, MetadataFilter) and flt.engine_query is not None:
        out.append(flt.engine_query)
    return out


def only_terms(clauses: list[dict]) -> bool:
    """True if every clause is a plain term/terms query (what OpenSearch before 3.5 can run as a
    parent-field filter inside a nested kNN)."""
    return all(len(c) == 1 and next(iter(c)) in ("term", "terms") for c in clauses)


__all__ = [
    "OPERATORS", "TEXT_OPS", "KEY_ALIASES", "Condition", "MetadataFilter", "FilterError", "parse_filter", "coerce_filters",
    "leaf_values", "condition_matches", "matches", "allowed_ids", "MetadataColumns", "flatten_for_engine", "esqbe_fields",
    "condition_dsl", "to_query_dsl", "only_terms",
]
