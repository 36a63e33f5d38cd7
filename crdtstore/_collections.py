"""Exists only for sync/ and tests until they import from :mod:`crdtstore.record` (issue 15).

The collections live in ``crdtstore/record/_collections.py`` and ``_maps.py``.
"""

from .record._collections import _MISSING as _MISSING
from .record._collections import CollectionHost as CollectionHost
from .record._collections import ListCollection as ListCollection
from .record._collections import TextCollection as TextCollection
from .record._collections import _Collection as _Collection
from .record._collections import _utf8_len as _utf8_len
from .record._maps import SEP as SEP
from .record._maps import KeepAllMap as KeepAllMap
from .record._maps import MapCollection as MapCollection
from .record._maps import _jsonable as _jsonable
