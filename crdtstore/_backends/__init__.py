"""The journal and lease backends that ship with crdtstore, one package per backend.

``memory`` (one process), ``sqlite`` (one machine: journal, leases and schema in one store
file) and ``redis`` (many machines). Each is registered in the ``crdtstore.backends``
entry-point group under its URL scheme, as a backend of another package would be, so the
store finds none of them by name and nothing here is imported until a URL asks for it.
"""
