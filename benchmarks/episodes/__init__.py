"""Playing a run's episodes: the plan, each attempt, retries and outages; the sandbox and task
supply (``sources``); the ledger, the run folder and durable checkpoints (``recording``)."""
