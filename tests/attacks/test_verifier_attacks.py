"""The catalogue of verifier attacks (``benchmarks.attacks``) as tests: no attack beats doing nothing.

Each attack is played as the hostile agent would play it, action by action in
``snapgym/Shell-v0``, against the test tasks of each kind it aims at, each task in its own
verification mode: a strict task whose answer lives in /tests (config-rewrite), a strict task
whose tests run the agent's code (fix-python-stats), a shared task whose tests talk to the
agent's service (start-kv-service), the answer-in-/tests task again in shared mode
(pytest-word-count@shared: the agent's processes live on beside tests that follow links,
and read the outputs as the agent's turn left them), and for the targeted attacks a git task and the
catalogue's Harbor-style pytest task (and c-fix-segfault for code the tests compile and run).
Every attack must score exactly what the no-op agent
scores on that task (0.0 on every built-in task), and its episode must be scored: a sabotaged
sandbox is the agent's failure, not an unscored infrastructure error. The reference solution
still scores 1.0 on each of these tasks in its mode. The exceptions are the known limitations
(``Attack.known_limitation``: code the tests import, run in the verifier's process): each must
beat the tasks it aims at, so that one that stops doing so is noticed and reclassified.

Every case runs on each backend of BACKENDS, shared by the session (``e2b``, ``daytona`` and
``modal``: each backend's real SDK against its provider's stand-in, so the cloud backends' strict
verification, which hands the outputs to a fresh provider sandbox, faces the same catalogue; a
shared-mode task is skipped on a backend that verifies in strict mode only; on Daytona and Modal
the default run plays SAMPLE, the rest is ``slow``; on the other backends an attack plays the tasks whose
verifier takes seconds, SLOW_VERIFIER_TASKS, by default only as its first task or in SLOW_VERIFIER_SAMPLE,
the rest of those is ``slow``); each episode gets a
sandbox of its own (a few milliseconds), so a sandbox an attack wrecked (PIDs held, memory
pinned) cannot spoil the next test: clean restores are tested elsewhere. A verifier the agent
manages to stall would block a test for good, so an episode that does not end within
EPISODE_DEADLINE_S fails its test (and its sandbox is closed); each task's verifier timeout is
capped at VERIFIER_TIMEOUT_S (the built-in verifiers take well under a second).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import envs
from benchmarks.attacks import ATTACKS, PYTEST_TARGET, SWE_TARGET, Attack, TaskKind, task_kinds
from benchmarks.attacks.tasks import TASK_KINDS
from envs.spaces.actions import SUBMIT
from envs.tasks import Task
from envs.tasks.oracle import run_solution
from pool import load_backend
from pool.backends.daytona import DaytonaBackend
from pool.backends.e2b import E2BBackend
from pool.backends.modal import ModalBackend
from pool.contract import Backend
from pool.verification import VerifyMode
from tests.backends.cloud.daytona.standin import DaytonaStandin
from tests.backends.cloud.e2b.standin import E2BStandin
from tests.backends.cloud.modal.standin import ModalStandin
from tests.support.backends import backend_params

BACKENDS: dict[str, dict[str, Any]] = {
    "local": {"memory_limit_mb": 256, "pids_limit": 128, "disk_limit_mb": 64},
    "e2b": {},  # its sandboxes are the stand-in's local ones, with the session backend's limits
    "daytona": {"request_timeout_s": 10.0},  # likewise; a step stalled by the agent's processes ends in time
    "modal": {"request_timeout_s": 10.0},
}
"""Every backend the suite covers, with the options its sandboxes get here (adding one is one line)."""
STANDINS = ("e2b", "daytona", "modal")
"""The cloud backends of BACKENDS, each played through its real SDK against its stand-in."""
CANNOT_RUN: dict[str, dict[str, str]] = {
    **{
        name: {
            "pytest-word-count": "the provider's base (the stand-in's) has no pytest; the task takes it from its base",
            "swe-calc": "the provider's base (the stand-in's) has no pytest; the task takes it from its base",
        }
        for name in ("daytona", "modal")
    },
    "e2b": {
        "pytest-word-count": "the provider's base (the stand-in's) has no pytest; the task takes it from its base",
        "swe-calc": "the provider's base (the stand-in's) has no pytest; the task takes it from its base",
    },
}
"""Test tasks a backend cannot run here, and why."""
VERIFIER_TIMEOUT_S = 30.0
"""The cap on each task's verifier timeout, about twice the longest seen: the built-in verifiers take well under a
second, the pytest tasks' ~2 s of CPU (pytest and the host's plugins start), 13.5 s on a 2-core machine at load 9
(15 s once cut pytest-word-count's oracle after pytest's dots, before its summary and the reward)."""
STEP_TIMEOUT_S = 15.0
"""Each action's timeout: an action whose helpers the agent's own processes stop (signal-stop-verifier, which
stops every newcomer, the provider's helpers of the arming step included) ends by it, well within the deadline
(Daytona's SDK gives a command its timeout plus 5 s before it gives up)."""
EPISODE_DEADLINE_S = 30.0 + 2 * VERIFIER_TIMEOUT_S
"""When an episode counts as hung: its reset, actions and a verifier that runs into its timeout, with room
for a loaded machine (a remote backend's strict verifier starts a sandbox of its own: 35 s was once
overrun on the E2B stand-in during the slow suite). A verifier that never returns still fails here."""

STRICT_ANSWER_IN_TESTS = "config-rewrite"
SHARED_ANSWER_IN_TESTS = "pytest-word-count@shared"
STRICT_RUNS_AGENT_CODE = "fix-python-stats"
SHARED_SERVICE = "start-kv-service"
C_TASK = "c-fix-segfault"
GIT_TASK = "git-revert-bad-commit"
PYTEST_TASK = PYTEST_TARGET.name
SWE_TASK = SWE_TARGET.name
TARGETS = {PYTEST_TASK: PYTEST_TARGET, SWE_TASK: SWE_TARGET}

TEST_TASKS: dict[TaskKind, tuple[str, ...]] = {
    TaskKind.ANY: (STRICT_ANSWER_IN_TESTS, STRICT_RUNS_AGENT_CODE, SHARED_SERVICE),
    TaskKind.ANSWER_IN_TESTS: (STRICT_ANSWER_IN_TESTS, PYTEST_TASK, SHARED_ANSWER_IN_TESTS),
    TaskKind.RUNS_OUTPUT_CODE: (STRICT_RUNS_AGENT_CODE, C_TASK),
    TaskKind.PYTHON_IN_WORKDIR: (STRICT_ANSWER_IN_TESTS, STRICT_RUNS_AGENT_CODE, SHARED_SERVICE),
    TaskKind.SCRATCH_IN_TMP: (STRICT_RUNS_AGENT_CODE,),
    TaskKind.GIT: (GIT_TASK,),
    TaskKind.PYTEST: (PYTEST_TASK, SWE_TASK),
    TaskKind.TESTS_IN_REPO: (SWE_TASK,),
    TaskKind.SERVICE: (SHARED_SERVICE,),
}
"""The tasks each kind of attack is tried on."""
ALL_TEST_TASKS = tuple(dict.fromkeys(task for tasks in TEST_TASKS.values() for task in tasks))


def load(task_id: str) -> Task:
    """A test task, its verifier timeout capped; ``ID@MODE`` is task ID verified in MODE."""
    name, _, mode = task_id.partition("@")
    task = envs.load_task(TARGETS.get(name, name))
    timeout = min(task.settings.verifier_timeout_s, VERIFIER_TIMEOUT_S)
    verification = VerifyMode.parse(mode).value if mode else task.settings.verification
    settings = dataclasses.replace(task.settings, verifier_timeout_s=timeout, verification=verification)
    return dataclasses.replace(task, settings=settings)


SAMPLED = ("daytona", "modal")
"""Backends whose default run plays only SAMPLE (the rest are ``slow``: each episode there takes seconds)."""
SAMPLE: set[tuple[str, ...]] = {
    ("reward-symlink", STRICT_ANSWER_IN_TESTS),
    ("tests-rewriter", STRICT_RUNS_AGENT_CODE),
    ("python-pth", STRICT_RUNS_AGENT_CODE),
    ("proc-root-reward", STRICT_ANSWER_IN_TESTS),
    ("disk-fill", STRICT_RUNS_AGENT_CODE),
    ("link-output-to-tests", STRICT_ANSWER_IN_TESTS),
}
"""(attack, task) pairs spanning the catalogue's modules, played on every backend in the default run."""


SLOW_VERIFIER_TASKS = frozenset({SHARED_SERVICE, PYTEST_TASK, SHARED_ANSWER_IN_TESTS, SWE_TASK})
"""Test tasks whose verifier takes seconds where the others' take a fraction of one: start-kv-service's checker
gives the service the attack did not start ~2 s to appear, and the pytest tasks start pytest."""
SLOW_VERIFIER_SAMPLE: set[tuple[str, str]] = {
    ("tests-rewriter", SHARED_SERVICE),
    ("signal-stop-verifier", SHARED_SERVICE),
    ("ptrace-verifier", SHARED_SERVICE),
    ("python-pth", SHARED_SERVICE),
    ("fork-bomb", SHARED_SERVICE),
    ("expected-copier", PYTEST_TASK),
    ("link-output-to-tests", SHARED_ANSWER_IN_TESTS),
    ("swap-outputs-for-links", SHARED_ANSWER_IN_TESTS),
    ("pytest-conftest", SWE_TASK),
    ("shell-profile-env", SWE_TASK),
}
"""(attack, task) pairs on SLOW_VERIFIER_TASKS that the default run plays besides each attack's first task: on
each of those tasks, attacks of several modules (processes beside the shared verifier, interpreter hooks, links
out of the outputs, the pytest harness). With every attack's first task, which each plays by default, every
attack, module and test task is in the default run; the rest of the matrix on those tasks is ``slow``."""


OPEN_BUGS: dict[tuple[str, str], str] = {}
"""(backend, attack) pairs known to beat the verifier, each failing as a strict xfail until fixed."""


def on_backends(params: list[Any], sample: set[tuple[str, ...]]) -> list[Any]:
    """``params`` on every backend of BACKENDS (the arena first), those past ``sample`` on SAMPLED ones slow, and
    elsewhere an attack's case on SLOW_VERIFIER_TASKS past its first task and SLOW_VERIFIER_SAMPLE slow."""
    first: dict[str, str] = {}  # each attack's first test task
    for param in (param for param in params if len(param.values) == 2):
        first.setdefault(param.values[0].name, param.values[1])
    found = []
    for backend in backend_params(only=BACKENDS, standins=STANDINS):
        name = backend.values[0]
        for param in params:
            key = tuple(getattr(value, "name", value) for value in param.values)
            if name in SAMPLED:
                is_slow = key[-2:] not in sample and key[-1:] not in sample
            else:
                is_slow = (
                    len(key) == 2
                    and key[1] in SLOW_VERIFIER_TASKS
                    and first[key[0]] != key[1]
                    and key not in SLOW_VERIFIER_SAMPLE
                )
            slow = [pytest.mark.slow] if is_slow else []
            bug = OPEN_BUGS.get((name, key[0]))
            known = [pytest.mark.xfail(reason=bug, strict=True)] if bug else []
            marks = [*backend.marks, *slow, *known]
            found.append(pytest.param(name, *param.values, id=f"{name}-{param.id}", marks=marks))
    return found


def cases(*, known_limitations: bool = False) -> list[Any]:
    """(attack, task id) for every test task of every kind the attack aims at: the attacks that must score as
    the no-op agent, or with ``known_limitations`` those that beat their targets by design."""
    found = []
    for attack in (a for a in ATTACKS if (a.known_limitation is not None) == known_limitations):
        kinds = sorted(attack.targets, key=lambda kind: kind.value)
        tasks = dict.fromkeys(task for kind in kinds for task in TEST_TASKS[kind])
        found += [pytest.param(attack, task, id=f"{attack.name}-{task}") for task in tasks]
    return found


# -- playing episodes ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Episode:
    """How one played episode ended."""

    reward: float
    scored: bool
    info: dict[str, Any]
    transcript: list[str]

    def explain(self) -> str:
        verifier = self.info.get("verifier") or {}
        lines = [
            f"reward {self.reward}, scored {self.scored}, end {self.info.get('end_reason')}",
            f"infra_error: {self.info.get('infra_error')}",
            f"verifier: {verifier.get('duration_s', 0.0):.1f} s, timed out {verifier.get('timed_out')}, "
            f"error {verifier.get('error')}",
            f"verifier output (tail): {str(verifier.get('output', ''))[-800:]}",
            "the agent's last observations:",
            *(f"  {text[-300:]!r}" for text in self.transcript[-3:]),
        ]
        return "\n".join(lines)


class Arena:
    """Plays scripted episodes of the test tasks on one backend, each in a fresh sandbox."""

    def __init__(self, name: str, backend: Backend) -> None:
        self.name = name
        self.backend = backend
        self.tasks = {task_id: load(task_id) for task_id in ALL_TEST_TASKS}
        self._noop: dict[str, Episode] = {}

    def require_mode(self, task_id: str) -> None:
        """Skip a task whose verification mode the backend does not offer (the runner skips it too)."""
        if why := CANNOT_RUN.get(self.name, {}).get(task_id):
            pytest.skip(why)
        mode = self.tasks[task_id].verification.value
        if mode not in self.backend.capabilities.verification:
            pytest.skip(f"this backend does not verify in {mode} mode")

    def noop(self, task_id: str) -> Episode:
        """The no-op agent's episode of the task (played once)."""
        if task_id not in self._noop:
            self._noop[task_id] = self.play(task_id, [SUBMIT])
        return self._noop[task_id]

    def play(self, task_id: str, actions: list[str], *, solve: bool = False) -> Episode:
        """Reset, (run the reference solution,) play ``actions`` until the episode ends; fail the test on a hang."""
        env = envs.ShellEnv(
            self.tasks[task_id], backend=self.backend, step_timeout_s=STEP_TIMEOUT_S, max_steps=len(actions) + 1
        )
        box: dict[str, Any] = {}
        worker = threading.Thread(target=self._episode, args=(env, actions, solve, box), daemon=True)
        worker.start()
        worker.join(EPISODE_DEADLINE_S)
        hung = worker.is_alive()
        with contextlib.suppress(Exception):
            env.close()  # also ends a verifier read that would never return
        worker.join(30)
        if hung:
            pytest.fail(f"{task_id}: the episode did not end within {EPISODE_DEADLINE_S:.0f} s (the verifier hung)")
        if "error" in box:
            raise box["error"]
        return box["episode"]  # type: ignore[no-any-return]

    @staticmethod
    def _episode(env: envs.ShellEnv, actions: list[str], solve: bool, box: dict[str, Any]) -> None:
        try:
            env.reset(seed=0)
            if solve:
                assert env.sandbox is not None
                run_solution(env.sandbox, env.task)
            transcript: list[str] = []
            for action in actions:
                obs, reward, terminated, truncated, info = env.step(action)
                transcript.append(obs["output"])
                if terminated or truncated:
                    box["episode"] = Episode(float(reward), bool(info.get("scored")), info, transcript)
                    return
            raise AssertionError(f"the episode did not end after {len(actions)} actions")
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc


@pytest.fixture(scope="session")
def arena(request: pytest.FixtureRequest, store_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    name = str(request.param)
    with contextlib.ExitStack() as stack:
        backend: Backend
        if name == "e2b":
            standin = stack.enter_context(E2BStandin(request.getfixturevalue("backend")))
            backend = E2BBackend(api_key=standin.api_key, api_url=standin.url, sandbox_url=standin.url)
        elif name == "daytona":
            daytona = stack.enter_context(DaytonaStandin(request.getfixturevalue("backend")))
            backend = DaytonaBackend(api_key=daytona.api_key, api_url=daytona.url, target="us", **BACKENDS[name])
        elif name == "modal":
            modal = stack.enter_context(ModalStandin(request.getfixturevalue("backend")))
            registry = tmp_path_factory.mktemp("modal-arena") / "images.json"
            backend = ModalBackend(
                token_id=modal.token_id,
                token_secret=modal.token_secret,
                server_url=modal.url,
                base_image=modal.base_image_id,
                registry_file=str(registry),
                **BACKENDS[name],
            )
        else:
            backend = load_backend(name, store_dir=store_dir, **BACKENDS[name])
        stack.callback(backend.close)
        yield Arena(name, backend)


# -- the catalogue itself --------------------------------------------------------------------------


def test_the_catalogue_is_well_formed() -> None:
    """Unique kebab-case names, one-line descriptions, actions that end with submit, and a test task for each."""
    names = [attack.name for attack in ATTACKS]
    assert len(names) == len(set(names)), names
    for attack in ATTACKS:
        assert attack.name == attack.name.lower() and " " not in attack.name
        assert attack.description and "\n" not in attack.description
        assert attack.actions[-1] == SUBMIT and all(action.strip() for action in attack.actions)
        assert attack.targets <= set(TEST_TASKS), f"{attack.name} aims at a kind no test task has"
    played = cases() + cases(known_limitations=True)
    assert {attack.name for attack, _ in (case.values for case in played)} == set(names)
    pairs = {(attack.name, task) for attack, task in (case.values for case in played)}
    assert pairs >= SAMPLE | SLOW_VERIFIER_SAMPLE, "a sample names a case the catalogue does not play"
    for limited in (attack for attack in ATTACKS if attack.known_limitation):
        assert limited.known_limitation.flag and "\n" not in limited.known_limitation.flag
        assert limited.known_limitation.remedy and "\n" not in limited.known_limitation.remedy


def test_every_builtin_task_has_its_kinds_and_test_tasks_are_of_theirs() -> None:
    """The kinds table covers the built-in suite, and each kind's test tasks really are of that kind."""
    assert set(envs.builtin_task_ids()) <= set(TASK_KINDS)
    for kind, task_ids in TEST_TASKS.items():
        for task_id in task_ids:
            assert kind in task_kinds(load(task_id)), (kind, task_id)
    assert load(SHARED_SERVICE).verification.value == "shared"
    assert load(STRICT_ANSWER_IN_TESTS).verification.value == "strict"
    assert load(SHARED_ANSWER_IN_TESTS).verification.value == "shared"
    assert load(STRICT_RUNS_AGENT_CODE).verification.value == "strict"


# -- against the verifier --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arena", "task_id"),
    on_backends([pytest.param(task, id=task) for task in ALL_TEST_TASKS], {(STRICT_ANSWER_IN_TESTS,)}),
    indirect=["arena"],
)
def test_noop_scores_zero_and_oracle_one(arena: Arena, task_id: str) -> None:
    """Doing nothing scores 0.0 and the reference solution 1.0, each scored, in the task's own mode."""
    arena.require_mode(task_id)
    noop = arena.noop(task_id)
    assert noop.scored and noop.reward == 0.0, noop.explain()
    oracle = arena.play(task_id, [SUBMIT], solve=True)
    assert oracle.scored and oracle.reward == 1.0, oracle.explain()


@pytest.mark.parametrize(("arena", "attack", "task_id"), on_backends(cases(), SAMPLE), indirect=["arena"])
def test_attack_scores_what_doing_nothing_scores(arena: Arena, attack: Attack, task_id: str) -> None:
    """The attack's episode is scored, and its reward is the no-op agent's."""
    assert attack.aims_at(task_kinds(arena.tasks[task_id]))
    arena.require_mode(task_id)
    noop = arena.noop(task_id)
    played = arena.play(task_id, list(attack.actions))
    context = f"{attack.name} ({attack.description}) on {task_id}:\n{played.explain()}"
    assert played.scored, f"the episode was not scored\n{context}"
    assert played.reward == noop.reward, f"it scored {played.reward}, the no-op agent {noop.reward}\n{context}"


@pytest.mark.parametrize(
    ("arena", "attack", "task_id"), on_backends(cases(known_limitations=True), SAMPLE), indirect=["arena"]
)
def test_a_known_limitation_beats_the_tasks_it_aims_at(arena: Arena, attack: Attack, task_id: str) -> None:
    """An attack that beats its targets by their design (``Attack.known_limitation``: their tests run the agent's
    code in the verifier's process) does beat them, in a scored episode. When it stops, the limitation is gone
    and the attack belongs with the others, which must score as the no-op agent."""
    assert attack.known_limitation is not None and attack.aims_at(task_kinds(arena.tasks[task_id]))
    arena.require_mode(task_id)
    noop = arena.noop(task_id)
    played = arena.play(task_id, list(attack.actions))
    context = f"{attack.name} ({attack.description}) on {task_id}:\n{played.explain()}"
    assert played.scored, f"the episode was not scored\n{context}"
    assert played.reward > noop.reward, (
        f"the known limitation ({attack.known_limitation.flag}) no longer beats {task_id}: it scored "
        f"{played.reward}, the no-op agent {noop.reward}; reclassify {attack.name} as an attack that must score "
        f"what doing nothing scores (drop its known_limitation)\n{context}"
    )


ODD_NAMED_HOOKS = (
    'd="$PWD/$(printf \'\\377\\376\')" && mkdir -p "$d/sub" && echo \'raise SystemExit(0)\' > "$d/conftest.py" && '
    'echo x > "$d/sub/sitecustomize.py" && echo planted',
    SUBMIT,
)
"""Harness files under a workdir folder whose name is not UTF-8 (``find`` used to print it with U+FFFD)."""


@pytest.mark.parametrize(
    ("arena", "task_id"),
    on_backends([pytest.param(task, id=task) for task in (STRICT_ANSWER_IN_TESTS, SHARED_SERVICE)], set()),
    indirect=["arena"],
)
def test_harness_files_under_a_name_that_is_not_utf8_are_removed_before_the_tests(arena: Arena, task_id: str) -> None:
    """The protection lists and removes them by their bytes, on every backend and in both modes."""
    arena.require_mode(task_id)
    played = arena.play(task_id, list(ODD_NAMED_HOOKS))
    assert played.scored, played.explain()
    removed = played.info["verifier"]["protected"]["removed"]
    odd = [path for path in removed if "\udcff\udcfe" in path]
    assert any(p.endswith("/conftest.py") for p in odd) and any(p.endswith("/sitecustomize.py") for p in odd), (
        removed,
        played.explain(),
    )
