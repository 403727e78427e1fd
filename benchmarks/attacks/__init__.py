"""The catalogue of verifier attacks: hostile agents, scripted, each aimed at kinds of task.

Every attack is a :class:`Attack` (name, one-line description, shell actions ending with
``submit``, target kinds). Played by a replay agent, an attack must score what the no-op
agent scores, and its episode must be scored: ``tests/attacks/test_verifier_attacks.py`` checks
that on a few tasks of each kind, ``python -m benchmarks.run benchmark=integrity`` on a
whole suite in both verification modes. The exceptions are the known limitations
(``Attack.known_limitation``, ``benchmarks.attacks.imported``): attacks that beat a task by its
design (its tests run the agent's code in their own process), expected to beat the tasks they
aim at and reported apart.

>>> from benchmarks.attacks import ATTACKS, attacks_for
>>> from envs import load_task
>>> [a.name for a in attacks_for(load_task("config-rewrite"))][:2]
['reward-rewriter', 'reward-prewritten']
"""

from __future__ import annotations

from collections.abc import Iterable

from benchmarks.attacks import harness, hooks, imported, outputs, processes, reward, sabotage, tests_dir
from benchmarks.attacks.model import Attack, KnownLimitation, TaskKind
from benchmarks.attacks.tasks import PYTEST_TARGET, SWE_TARGET, TARGETS_DIR, target_tasks, task_kinds
from envs.tasks import Task
from pool.errors import ConfigError

ATTACKS: tuple[Attack, ...] = (
    *reward.ATTACKS,
    *tests_dir.ATTACKS,
    *hooks.ATTACKS,
    *harness.ATTACKS,
    *processes.ATTACKS,
    *sabotage.ATTACKS,
    *outputs.ATTACKS,
    *imported.ATTACKS,
)
"""Every attack, grouped by what it goes for: the reward, the tests, hooks, the test harness in the outputs,
processes, sabotage, outputs, and last the code the tests import (known limitations: ``Attack.known_limitation``)."""


def attacks_for(task: Task, attacks: Iterable[Attack] = ATTACKS) -> list[Attack]:
    """The attacks that aim at ``task``."""
    kinds = task_kinds(task)
    return [a for a in attacks if a.aims_at(kinds)]


def select_attacks(names: Iterable[str]) -> list[Attack]:
    """The attacks named (all of them when ``names`` is empty), in catalogue order.

    Raises:
        ConfigError: a name is not in the catalogue.
    """
    wanted = list(names)
    known = {a.name for a in ATTACKS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(f"unknown attack(s) {', '.join(unknown)}; the catalogue has: {', '.join(sorted(known))}")
    return [a for a in ATTACKS if not wanted or a.name in wanted]


__all__ = [
    "ATTACKS",
    "PYTEST_TARGET",
    "SWE_TARGET",
    "TARGETS_DIR",
    "Attack",
    "KnownLimitation",
    "TaskKind",
    "attacks_for",
    "select_attacks",
    "target_tasks",
    "task_kinds",
]
