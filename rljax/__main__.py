"""``python -m rljax train|sweep|presets|launch ...``: the ``rljax`` command."""

from rljax.cli import main

if __name__ == "__main__":
    main()
