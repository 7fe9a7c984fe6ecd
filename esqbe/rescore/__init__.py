"""Second stage: rescorers over sentence vectors, their declared parameters (the registry), word statistics."""
from . import rescorers  # noqa: F401  (the built-in rescorers register themselves when the package is imported)
