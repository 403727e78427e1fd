"""What a run's episodes are played with: the tasks of the suite, and the sandboxes they get (a backend
in this process or a Ray pool, and a second backend for the tasks that ask for GPUs)."""
