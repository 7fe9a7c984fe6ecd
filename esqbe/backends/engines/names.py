"""Engine object names checked against the engines' own naming rules before any request, and URL path segments
percent-encoded: a name must never become a wildcard (`*`), a list (`,`), another path (`../..`) or an API
(`_security`) on the wire.

- Index (and alias) names, Elasticsearch and OpenSearch alike (the create-index API's documented rules): lowercase
  only (for an index esqbe creates; an existing alias may have capitals); not `\\ / * ? " < > | , #`, space or `:`
  (7.0+); not starting with `-`, `_` or `+`; not `.` or `..`; at most 255 bytes (UTF-8).
- Elasticsearch inference endpoint ids (`PUT _inference/{task}/{inference_id}`, the request's `validate()`,
  MlStrings.isValidId): lowercase letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit;
  esqbe also keeps ML's id length limit of 64.
- OpenSearch search pipeline ids and ML Commons connector/model names: the engine documents no rule and accepts any
  string on PUT, but GET and DELETE read `*` as a wildcard and `,` as a list (a `DELETE _search/pipeline/*` removes
  every pipeline), so esqbe refuses those, path characters (`/`, `\\`, `?`, `#`, `%`), whitespace and control
  characters, `.` / `..`, a leading `_` (the APIs' own words), and more than 255 bytes.
Every name that passes still goes into a path through `path_segment` (percent-encoded, nothing kept as is but
RFC 3986's unreserved characters)."""
from __future__ import annotations

import re
from urllib.parse import quote

from ...errors import ParameterError

MAX_INDEX_NAME_BYTES = 255
MAX_INFERENCE_ID_CHARS = 64
MAX_PIPELINE_NAME_BYTES = 255
#: the companion indexes an esqbe index owns, named `<index><suffix>` (watchstore.py, aliasstore.py, followstore.py)
WATCH_INDEX_SUFFIX = "-esqbe-watches"
ALIAS_INDEX_SUFFIX = "-esqbe-aliases"
FOLLOW_INDEX_SUFFIX = "-esqbe-follows"
COMPANION_SUFFIXES = (WATCH_INDEX_SUFFIX, ALIAS_INDEX_SUFFIX, FOLLOW_INDEX_SUFFIX)

_INDEX_FORBIDDEN = set('\\/*?"<>|,# :')
_INFERENCE_ID = re.compile(r"[a-z0-9](?:[a-z0-9_\-.]*[a-z0-9])?")
_PIPELINE_FORBIDDEN = set("*,/\\?#%")


def check_index_name(name: str, *, what: str = "--index", creating: bool = False, companions: bool = False) -> str:
    """`name` if it is a valid Elasticsearch/OpenSearch index (or alias) name, else ParameterError naming the rule.
    `creating`: also the lowercase rule, which binds the names of indices (not of an existing alias). `companions`:
    an esqbe index being made, whose companion indexes (`COMPANION_SUFFIXES`) must be valid names too."""
    if not isinstance(name, str) or not name:
        raise ParameterError(f"{what}: an index name is needed")
    shown = repr(name[:80])
    if name in (".", ".."):
        raise ParameterError(f"{what}: {shown} is not an index name (`.` and `..` are refused by the engines)")
    bad = sorted({c for c in name if c in _INDEX_FORBIDDEN or ord(c) < 32 or ord(c) == 127})
    if bad:
        listed = ", ".join(repr(c) for c in bad)
        raise ParameterError(f"{what}: {shown} contains {listed}; index names cannot contain "
                             "\\ / * ? \" < > | , # : or spaces (the engines' naming rules)")
    if name[0] in "-_+":
        raise ParameterError(f"{what}: {shown} starts with {name[0]!r}; index names cannot start with -, _ or +")
    if len(name.encode("utf-8")) > MAX_INDEX_NAME_BYTES:
        raise ParameterError(f"{what}: the index name is {len(name.encode('utf-8'))} bytes; at most "
                             f"{MAX_INDEX_NAME_BYTES}")
    longest = max(len(x) for x in COMPANION_SUFFIXES)
    if companions and len(name.encode("utf-8")) + longest > MAX_INDEX_NAME_BYTES:
        named = ", ".join(f"NAME{x}" for x in COMPANION_SUFFIXES)
        raise ParameterError(f"{what}: the index name is {len(name.encode('utf-8'))} bytes; an esqbe index names its "
                             f"companion indexes after it ({named}), so at most {MAX_INDEX_NAME_BYTES - longest} bytes")
    if creating and name != name.lower():
        raise ParameterError(f"{what}: {shown} has capitals; the engines create only lowercase index names")
    return name


def check_inference_id(name: str, *, what: str = "--name") -> str:
    """`name` if Elasticsearch accepts it as an inference endpoint id, else ParameterError."""
    if not isinstance(name, str) or not name:
        raise ParameterError(f"{what}: a name is needed")
    if len(name) > MAX_INFERENCE_ID_CHARS or not _INFERENCE_ID.fullmatch(name):
        raise ParameterError(f"{what}: {name[:80]!r} is not an Elasticsearch inference endpoint id: 1 to "
                             f"{MAX_INFERENCE_ID_CHARS} lowercase letters, digits, '-', '_' or '.', starting and "
                             "ending with a letter or digit")
    return name


def check_pipeline_name(name: str, *, what: str = "--name") -> str:
    """`name` if it is safe as an OpenSearch search pipeline id and ML Commons connector/model name, else
    ParameterError (see the module's notes: no wildcard, list, path or control character)."""
    if not isinstance(name, str) or not name:
        raise ParameterError(f"{what}: a name is needed")
    shown = repr(name[:80])
    if name in (".", ".."):
        raise ParameterError(f"{what}: {shown} is not a name")
    bad = sorted({c for c in name if c in _PIPELINE_FORBIDDEN or c.isspace() or ord(c) < 32 or ord(c) == 127})
    if bad:
        listed = ", ".join(repr(c) for c in bad)
        raise ParameterError(f"{what}: {shown} contains {listed}; OpenSearch reads * as a wildcard and , as a list "
                             "in pipeline names, and / \\ ? # % and spaces do not belong in a URL path")
    if name.startswith("_"):
        raise ParameterError(f"{what}: {shown} starts with '_', which OpenSearch's APIs use for their own words")
    if len(name.encode("utf-8")) > MAX_PIPELINE_NAME_BYTES:
        raise ParameterError(f"{what}: the name is {len(name.encode('utf-8'))} bytes; at most {MAX_PIPELINE_NAME_BYTES}")
    return name


def check_reranker_name(engine: str, name: str, *, what: str = "--name") -> str:
    """The reranker's name checked by the rule of the engine it goes to."""
    return check_inference_id(name, what=what) if engine == "elasticsearch" else check_pipeline_name(name, what=what)


def path_segment(value: str) -> str:
    """`value` as one URL path segment: every character but RFC 3986's unreserved ones percent-encoded (UTF-8), so
    `/`, `*`, `,`, `?`, `#` and `%` cannot change the path; `.` and `..` (which a client or proxy may resolve) are
    refused."""
    if value in ("", ".", ".."):
        raise ParameterError(f"{value!r} cannot be a URL path segment")
    return quote(value, safe="")
