"""What a run writes down and reads back on resume: the ledger and its records, each episode's files,
the run's directory, and the journal and checkpoints of durable episodes."""
