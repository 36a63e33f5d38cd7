"""``python -m sync --store sqlite:///runs/store.db [--host H] [--port P] [--secret-file F]``:
start the hub."""

from ._cli import main

main()
