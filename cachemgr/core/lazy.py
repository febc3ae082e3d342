"""A module imported when first used, for the command line's handlers.

``cache_ops = lazy("cachemgr.ops.cache")`` gives an object whose attribute access imports
the module (``importlib.import_module``, which holds the import lock, so two threads get
the same module) and reads the attribute from it. The caller keeps the real import under
``if TYPE_CHECKING:`` so mypy sees the module's types::

    if TYPE_CHECKING:
        from cachemgr.ops import cache as cache_ops
    else:
        cache_ops = lazy("cachemgr.ops.cache")

Standard library only, and only importlib: importing this costs nothing worth measuring.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's import is not needed here; mypy reads it as True
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any


class _Lazy:
    """Stands for a module until an attribute is read; then is a thin front to it."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # called only for names not found on this object: the module's names
        module: ModuleType = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy(name: str) -> _Lazy:
    """The module ``name``, imported when one of its attributes is first read."""
    return _Lazy(name)
