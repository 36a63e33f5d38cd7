"""The record as a package by capability (issue 15): see the modules' docstrings."""

from ._replay import BulkLoad as BulkLoad
from ._replay import tree_merge as tree_merge
from ._replica import Replica as Replica
