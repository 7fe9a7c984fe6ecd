"""Credentials kept out of what esqbe prints or logs, in one place.

An engine URL may carry a user name and password (`http://elastic:S3CRET@host:9200`: the engine clients use them as
basic auth), and the `api_key` and `password` settings are secrets outright. Whatever shows a setting, a backend's
URL or an error message passes through here: `esqbe config` and `esqbe stats` (and their JSON), the CLI's error
lines and tracebacks, the server's /stats and its log. The URL's user name is kept (it says which account), its
password is `***`; a user part without a password (often a token) is `***` whole.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping

MASK = "***"
#: the settings whose values are secrets whole
SECRET_SETTINGS = ("api_key", "password", "openalex_api_key")
#: a URL's scheme and whatever stands before its last `@` within one token of text (greedy: a password holding `@`,
#: `/` or `#` unescaped is masked whole; a path with an `@` in it is masked too, which costs only what is shown)
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)([^\s'\"<>]*)@", re.IGNORECASE)


def _masked_userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    if colon and user and not any(c in user for c in "/?#"):
        return f"{user}:{MASK}"
    return MASK


def _sub(match: re.Match) -> str:
    return f"{match.group(1)}{_masked_userinfo(match.group(2))}@"


def mask_urls(text) -> str:
    """`text` (an error message, a log line, a traceback) with the credentials of every URL in it masked."""
    return _USERINFO.sub(_sub, str(text))


def mask_url(url: str | None) -> str | None:
    """One URL (a setting's value, a backend's address) with its credentials masked; None stays None. Without a
    scheme (`elastic:pw@host:9200`) everything before the last `@` is the user part."""
    if url is None:
        return None
    url = str(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    userinfo, _, host = rest.rpartition("@")
    return f"{scheme}{sep}{_masked_userinfo(userinfo)}@{host}"


def url_has_credentials(url: str | None) -> bool:
    """Whether `url` carries a user part (`user:password@`, `token@`) that `mask_url` masks."""
    return url is not None and mask_url(url) != url


def redact_settings(values: Mapping) -> dict:
    """Settings as a dict (`Settings.to_dict`) for people: the secret settings `***`, the URL's credentials masked."""
    out = dict(values)
    for name in SECRET_SETTINGS:
        if out.get(name):
            out[name] = MASK
    if out.get("url"):
        out["url"] = mask_url(out["url"])
    return out


class MaskUrlCredentials(logging.Filter):
    """A logging filter: the record's message, and the traceback it carries, with every URL's credentials masked
    (installed on esqbe's own loggers: `guard_logger`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_urls(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_urls(logging.Formatter().formatException(record.exc_info))
        return True


def guard_logger(name: str) -> logging.Logger:
    """The logger `name` with `MaskUrlCredentials` installed (once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, MaskUrlCredentials) for f in logger.filters):
        logger.addFilter(MaskUrlCredentials())
    return logger
