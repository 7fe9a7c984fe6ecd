"""`esqbe serve`: the FastAPI app (`create_app`) and the server (`serve`).

`from esqbe.server import ServeOptions, create_app` is the documented embedding entry
(README, "Inside an existing FastAPI or Starlette app"): keep these names here."""
from .app import create_app, serve  # noqa: F401
from .options import ServeOptions  # noqa: F401
