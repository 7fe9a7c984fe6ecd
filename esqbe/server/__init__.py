"""`esqbe serve`: the FastAPI app (`create_app`) and the server (`serve`).

`from esqbe.server import ServeOptions, create_app` is the documented embedding entry
(docs/serving.md, "Inside an existing FastAPI or Starlette app"): keep these names here. They load lazily, so that
`esqbe query` can read a running server's discovery record (esqbe.server.discovery) and talk to it
(esqbe.server.client) without importing FastAPI."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app, serve  # noqa: F401
    from .options import ServeOptions  # noqa: F401

__all__ = ["create_app", "serve", "ServeOptions"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "serve"):
        from . import app

        return getattr(app, name)
    if name == "ServeOptions":
        from .options import ServeOptions

        return ServeOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
