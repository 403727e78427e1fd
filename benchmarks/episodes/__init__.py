"""Playing a run's episodes: the plan, the sandbox supply, each attempt, retries, durable
checkpoints, the ledger and the run folder."""
