"""``python -m rljax train ...`` / ``python -m rljax launch ...``: the ``rljax`` command."""

from rljax.cli import main

if __name__ == "__main__":
    main()
