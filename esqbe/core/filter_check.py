"""Filters that cannot mean what the user meant, found before a query answers "no hits": a key no paper has
(a typo: `yaer>=2015`) is an error listing the index's keys, and a value no paper has for its key
(`venue=arxiv` where "ArXiv" is stored, `author=Sugiyama` for "Masashi Sugiyama") is an error that says
so and suggests the near values (same but for case, starting with it, a word starting with it) and the
operators that would match them (`~=` any case, `^=` prefix). Checked over an index's metadata columns
(the embedded backend's `MetadataColumns`); each condition on its own, so conditions that each match
some papers but none together still answer "no hits"."""
from __future__ import annotations

import re
from collections.abc import Sequence

from .filters import (
    KEY_ALIASES,
    TEXT_OPS,
    UNFILTERED_METADATA_KEYS,
    Condition,
    FilterError,
    MetadataColumns,
    _as_number,
    _as_text,
    fold,
)
from .names import FLAGS, PARTS

#: the operators whose value must match something (negations and ranges may rightly match nothing)
_VALUE_OPS = ("=", "in", *TEXT_OPS)
_MAX_SUGGESTIONS = 5
_MAX_KEYS_LISTED = 40
#: a value no paper has gets a near-value search: for the first this many values of a list (one search per filter:
#: the first condition that cannot match is the error), over at most this many of the key's distinct values
_NEAR_MAX_WANTED = 3
_NEAR_MAX_STORED = 200_000


#: metadata esqbe keeps for itself (the tagger's flag and soft labels, the hash of the input a paper was tagged from)
INTERNAL_KEYS = frozenset({"facets_predicted", "facet_probs", "input_hash"})
#: the parts of a split author name (and the organisation flag): kept to write a citation, searched as `author`
_UNLISTED_PATHS = frozenset({f"authors.{part}" for part in (*PARTS, *FLAGS, "literal")})


def listed_key(path: str) -> bool:
    """Whether a metadata key (a dotted path) is one to show a user in a list of keys (`esqbe stats`, a filter's
    key list): esqbe's internal keys and a name's parts are not (they still filter when named), nor what no filter
    reads (UNFILTERED_METADATA_KEYS)."""
    top = path.split(".", 1)[0]
    return top not in INTERNAL_KEYS and top not in UNFILTERED_METADATA_KEYS and path not in _UNLISTED_PATHS


def did_you_mean(word: str, known: Sequence[str]) -> str | None:
    """The known name nearest a misspelt one (case, a swap, a few edits: `yaer` -> `year`), or None."""
    w = word.lower()
    limit = max(1, min(2, len(w) // 4))  # 1 edit in a short name, 2 in a long one

    def distance(k: str) -> int:
        k = k.lower()
        return 0 if k == w else 1 if sorted(k) == sorted(w) else _edits(w, k, limit)

    best = min(((distance(k), k) for k in known), default=(limit + 1, ""))
    return best[1] if best[0] <= limit else None


def index_paths(columns: MetadataColumns) -> list[str]:
    """Every metadata path some paper has (dotted leaves), sorted."""
    return sorted(set(columns.kw) | set(columns.num))


def _known(path: str, paths: list[str]) -> bool:
    prefix = path + "."
    return any(p == path or p.startswith(prefix) for p in paths)


def check_conditions(conditions: Sequence[Condition], columns: MetadataColumns) -> None:
    """Raise FilterError for the first condition that cannot match as written."""
    if not len(columns):
        return  # an empty index: nothing to check against
    paths = index_paths(columns)
    for c in conditions:
        if c.op == "not exists":
            continue
        if not _known(c.path, paths):
            raise FilterError(_unknown_key_message(c, paths))
        if c.op in _VALUE_OPS and not columns.mask(c).any():
            raise FilterError(_no_value_message(c, columns))


def _unknown_key_message(c: Condition, paths: list[str]) -> str:
    public = [p for p in paths if listed_key(p)]
    tops = sorted({p.split(".")[0] for p in public})
    listed = [p for p in public if "." not in p or p.split(".")[0] in ("external_ids", "authors")]
    shown = listed if len(listed) <= _MAX_KEYS_LISTED else tops
    aliases = [f"{a} (= {p})" for a, p in KEY_ALIASES.items() if _known(p, paths)]
    near = did_you_mean(c.path, [*public, *tops])
    hint = f"; did you mean {near}?" if near else "."
    return (f"filter {c}: no paper in the index has the key {c.path!r}{hint} "
            f"The index's keys: {', '.join(shown)}" + (f"; short forms: {', '.join(aliases)}" if aliases else ""))


def _no_value_message(c: Condition, columns: MetadataColumns) -> str:
    """Why `c` matches nothing, with the stored values near what it asks for. The near-value search is one pass over
    the key's distinct values (folded once per index generation, at most `_NEAR_MAX_STORED` of them) for the first
    `_NEAR_MAX_WANTED` values of the condition: what a list of a thousand unknown names costs is what a few cost."""
    wanted = list(c.value) if isinstance(c.value, tuple) else [c.value]
    texts = columns.distinct_texts(c.path) if c.path in columns.kw else []
    examined = texts[:_NEAR_MAX_STORED]
    suggestions = _near_many([_as_text(w) for w in wanted[:_NEAR_MAX_WANTED]], examined)
    what = "any of these values" if len(wanted) > 1 else "this value"
    msg = f"filter {_short(c)}: no paper has {what} for {c.key}"
    if suggestions:
        shown = ", ".join(repr(s) for s in suggestions[:_MAX_SUGGESTIONS])
        msg += f"; near values in the index: {shown}"
        w = _as_text(wanted[0])
        if any(fold(s) == fold(w) for s in suggestions):
            msg += f" (= is exact; ignoring case and accents: {c.key}~={_quoted(w)})"
        elif any(fold(s).startswith(fold(w)) for s in suggestions):
            msg += f" (a prefix, ignoring case and accents: {c.key}^={_quoted(w)})"
    elif c.path in columns.num and all(_as_number(w) is not None for w in wanted):
        vals = columns.num[c.path][1]
        msg += f" (its values run from {_as_text(float(vals.min()))} to {_as_text(float(vals.max()))})"
    elif texts and len(texts) <= 2 * _MAX_SUGGESTIONS:  # a few values: all of them; many: none is near, say so
        msg += f" (its values: {', '.join(repr(t) for t, _ in sorted(texts))})"
    elif texts:
        msg += f" (none of its {len(texts)} values is near it)"
    limited = ([f"for its first {_NEAR_MAX_WANTED} values (of {len(wanted)})"] if len(wanted) > _NEAR_MAX_WANTED
               else []) + ([f"among {len(examined)} of the {len(texts)} stored values"] if len(texts) > len(examined)
                           else [])
    if limited:  # a limit applied is a limit said
        msg += f"; near values were looked up {' '.join(limited)}"
    return msg


def _short(c: Condition) -> str:
    """The condition as the message shows it: a long value list cut to its first few values and how many more."""
    if isinstance(c.value, tuple) and len(c.value) > _MAX_SUGGESTIONS:
        head = Condition(c.key, c.op, c.value[:_MAX_SUGGESTIONS])
        return str(head)[:-1] + f", ... {len(c.value) - _MAX_SUGGESTIONS} more)"
    return str(c)


def near_values(value: str, stored: Sequence[str]) -> list[str]:
    """Stored texts near `value`, nearest first: the same but for case and accents (`fold`), then those starting
    with it, then those with a word starting with it, then those a few edits away (a typo: `Garcia-Mato`); at most
    a few of each, never values merely first in alphabetical order."""
    return _near_many([value], [(s, fold(s)) for s in stored])


def _near_many(values: Sequence[str], stored: Sequence[tuple[str, str]]) -> list[str]:
    """`near_values` of each of `values` (in order, without repeats) over (text, folded text) pairs folded once."""
    out: list[str] = []
    for value in values:
        for s in _near(fold(value.strip()), stored):
            if s not in out:
                out.append(s)
    return out


def _near(v: str, folded: Sequence[tuple[str, str]]) -> list[str]:
    if not v:
        return []
    same = [s for s, f in folded if f == v]
    prefix = [s for s, f in folded if f.startswith(v) and f != v]
    taken = set(same) | set(prefix)
    # a word of the stored text starts with it (words split at spaces and hyphens), found by one regular expression
    starts_word = re.compile(r"(?:^|[\s\-])" + re.escape(v)) if not _WORDS.search(v) else None
    word = ([s for s, f in folded if s not in taken and starts_word.search(f)] if starts_word else [])
    taken |= set(word)
    limit = max(1, min(3, len(v) // 4))  # edits allowed: 1 for a short value, up to 3 for a long one
    close = sorted((d, s) for s, f in folded if s not in taken and abs(len(f) - len(v)) <= limit
                   and (f[:1] == v[:1] or f[-1:] == v[-1:]) and (d := _edits(f, v, limit)) <= limit)
    return (same + prefix[:_MAX_SUGGESTIONS] + word[:_MAX_SUGGESTIONS]
            + [s for _, s in close[:_MAX_SUGGESTIONS]])[: 2 * _MAX_SUGGESTIONS]


_WORDS = re.compile(r"[\s\-]+")


def _edits(a: str, b: str, limit: int) -> int:
    """Levenshtein distance of `a` and `b`, or `limit + 1` as soon as it must exceed `limit`."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


def _quoted(value: str) -> str:
    return value if value.replace("-", "").replace("_", "").isalnum() else '"' + value.replace('"', '\\"') + '"'
