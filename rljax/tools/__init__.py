"""After training: evaluate a run's checkpoint again, aggregate returns (IQM and bootstrap
intervals), export a policy. Commands: ``rljax eval``, ``rljax export``."""
