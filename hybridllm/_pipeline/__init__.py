"""The request pipeline one client drives: ``core.Core`` runs a question through its four steps,
one module each (see ``core``'s docstring)."""

from .core import Core
from .ports import CachePort, PolicyPort
from .request import Options

__all__ = ["CachePort", "Core", "Options", "PolicyPort"]
