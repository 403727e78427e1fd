"""The baselines the scenarios measure snapgym against: a naive copy-and-start reset, Docker's
throw-away container, and plain processes with no isolation."""
