"""What the engine backend's companion stores (watches, aliases) use of EngineBackend, declared once for the type
checker. Each store is a mixin deriving from `EngineHost`; at run time `EngineHost` is `object` and the methods come
from EngineBackend's other bases, so this module adds nothing to the MRO (as esqbe.backends.embedded.host)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import BackendError

if TYPE_CHECKING:
    class EngineHost:
        name: str
        index: str
        client: Any
        _mapping: dict | None
        def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...
        def _body(self, resp: Any) -> Any: ...
        def _status(self, exc: BaseException) -> int | None: ...
        def _error(self, what: str, exc: BaseException) -> BackendError: ...
        def _get_mapping(self) -> dict | None: ...
        def _index_mapping(self) -> dict: ...
        def _bulk(self, actions: list[dict]) -> dict[str, tuple[bool, dict]]: ...
else:
    EngineHost = object
