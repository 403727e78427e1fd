"""The plumbing of an episode, below the environments that play it.

- :mod:`~envs.episode.sources`: where sandboxes come from (a backend, or a pool), chosen once;
  :mod:`~envs.episode.default_backend` holds the backends named by string, one per process.
- :mod:`~envs.episode.taskset`: an environment's tasks and how each is played here;
  :mod:`~envs.episode.network`: the network of each phase, and a failure the network caused.
- :mod:`~envs.episode.resume`: where an episode starts (``reset``'s options);
  :mod:`~envs.episode.clock`: the agent's time budget.
- :mod:`~envs.episode.scoring`: how the end becomes a reward and ``info``;
  :mod:`~envs.episode.endstate`: the end state's digest.

It builds on :mod:`envs.tasks`, never on the environments.
"""
