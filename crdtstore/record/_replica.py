"""One replica of a run's record: a pycrdt Doc plus crdtstore's bookkeeping. No I/O.

The replica is the pure core that the record (live, with a journal behind it), compaction,
replay and the simulator all drive. Its parts, each a base class in its own module:

- :class:`~._provenance.ProvenanceIndex`: who wrote the current value of each map key;
- :class:`~._document.ReplicaDocument`: the document, its collection registry, local
  transactions and their captured updates, checked applies of update bytes;
- :class:`~._replay.JournalReplay`: journal entries applied in causal order, provenance exact;
- :class:`~._external.ExternalUpdates`: updates made outside the typed API, with their effect.
"""

from __future__ import annotations

from ._external import ExternalUpdates


class Replica(ExternalUpdates):
    """A Doc with its collection registry, update capture and provenance index.

    Args:
        max_update: the largest update (bytes) :meth:`check_update` lets through.
    """
