"""Exists only for tests and the modules that import it until they import from
:mod:`crdtstore.record` (issue 15). The view lives in ``crdtstore/record/_view.py``.
"""

from .record._view import ScopedMap as ScopedMap
from .record._view import View as View
from .record._view import _Rule as _Rule
