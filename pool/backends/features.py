"""The documentation's backend-by-feature table: what each backend class declares, and what runs recorded.

``python -m pool.backends --markdown docs/backends/capabilities.md`` writes it between the markers of
that page, and ``tests/runner/test_capability_table.py`` fails while the page differs from what
:func:`feature_table` renders now.

Every cell of a feature row comes from a declaration made by the backend class, so the table renders without
credentials, an engine or a started backend: a cloud backend's ``declared_capabilities()`` (fixed by
its provider, :class:`~pool.contract.DeclaresCapabilities`), or the ``capability_range()`` of a
backend whose capabilities depend on the machine and its options
(:class:`~pool.contract.DeclaresCapabilityRange`: the typical machine first, then each condition
that changes something). A cell that differs across a backend's range shows each value, the typical
machine's first, with a footnote naming the condition of each; a cell without one holds on every
machine. ``python -m pool.backends`` shows what the backends do on this machine instead.

Two feature rows are not fields of :class:`~pool.capabilities.Capabilities`, and are derived (each row's
note under the table says from what): task images from ``bases``, installed agents from
:func:`pool.backends.has_model_gateway`, the rule by which the runner refuses them.

The last two rows are results, not declarations: how the conformance suite and the verifier-attack
catalogue went on each backend, where and when, as recorded in ``docs/results/conformance.json``
(:mod:`pool.testing.record`; the test suite's ``--record-conformance`` writes it). The table reads that
file and nothing else, so it renders the same until the file is recorded again; a backend without an
entry says "not recorded".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pool.backends import BACKENDS, backend_class, has_model_gateway
from pool.capabilities import Capabilities, ChangesSource, EgressControl, Enforcement
from pool.contract import DeclaresCapabilities, DeclaresCapabilityRange
from pool.errors import ConfigError
from pool.testing.record import RESULTS_FILE, AttackResult, ConformanceResult, Results, Stamp, load_results

BEGIN = "<!-- BEGIN generated: python -m pool.backends --markdown docs/backends/capabilities.md -->"
END = "<!-- END generated (edit pool/backends/features.py or a backend's declaration, then regenerate) -->"
"""The markers the table is written between; what lies outside them is the page's own text."""
COMMAND = "python -m pool.backends --markdown docs/backends/capabilities.md"
"""The one command that regenerates the documentation's table."""
RESOURCES = ("memory", "cpu", "pids")
"""The limits the resources row shows (disk has its own row)."""
RESULTS = Path(__file__).resolve().parents[2] / RESULTS_FILE
"""The recorded results the table shows (in a checkout of snapgym; elsewhere none are recorded)."""
RECORD = "--record-conformance docs/results/conformance.json"
"""The test suite's option that records them again (docs/backends/capabilities.md gives the whole command)."""
CONFORMANCE = (
    "The rows above the last two are declarations. The last two are results of real runs, recorded in "
    "`docs/results/conformance.json` (its format: `pool/testing/record.py`) and only read for this table: "
    "the conformance suite `pool.testing.check_backend` (`tests/contract/test_conformance.py` on every "
    "backend this machine runs; each cloud backend through its provider's real SDK against the stand-in "
    "in `tests/backends/cloud/`, and live where credentials are set) and the verifier-attack catalogue "
    "(`tests/attacks/test_verifier_attacks.py`). The suite follows the declaration: it verifies in each "
    "declared verification mode, pushes past the memory and disk limits declared enforced, refuses the "
    "network modes not declared and checks the audit where one is, checks who lists the end-state "
    "changes, forks where fork is declared and refuses a GPU where none is; a declaration a backend does "
    f"not keep fails it. Those tests run with `{RECORD}` record their outcome again. "
    "`python -m pool.backends` shows what each backend declares on this machine."
)
"""The note on where the declarations are checked and the results come from."""
RESULT_ROWS = {
    "conformance": "`pool.testing.check_backend`, as recorded: `passed`, or `failed:` and the check it stopped at "
    "(its footnote says why); where it ran (`machine`: the machine that recorded it, its kernel and engine; "
    "`stand-in`: the provider's real SDK against its stand-in in `tests/backends/cloud/`; `live`: the provider itself, "
    "with credentials), the day (UTC) and snapgym's commit (`+`: its checkout had uncommitted changes); "
    '"not recorded": no run is on record.',
    "attack catalogue": "`tests/attacks/test_verifier_attacks.py`, as recorded: of the catalogue's (attack, task) "
    "cases, how many were played (the rest were skipped on this backend, e.g. for a verification mode it "
    "lacks, or left out of that run as `slow`), how many scored other than the no-op agent, and how many were "
    "left unscored (each named in a footnote; any other failure too); where, day and commit as above.",
}
"""The rows of recorded results, and what their cells say."""
_DECLARED = {False: "fixed: `declared_capabilities()`", True: "per machine: `capability_range()`"}
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


@dataclass(frozen=True, slots=True)
class Feature:
    """One row of the table."""

    name: str
    source: str
    """Where its cells come from and what their values mean (a note under the table, Markdown)."""
    cell: Callable[[str, Capabilities], str]
    """The short cell of a backend (by name) with one set of capabilities it declares."""
    detail: Callable[[Capabilities], str | None] = lambda _: None
    """More than fits in the cell (a footnote), if anything."""


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _enforcement(how: Enforcement) -> str:
    return "no" if how is Enforcement.NONE else how.value


def _images(capabilities: Capabilities) -> str:
    kinds = [label for base, label in (("image", "image"), ("dockerfile", "Dockerfile")) if base in capabilities.bases]
    return ", ".join(kinds) or "no"


def _resources(capabilities: Capabilities) -> str:
    """One enforcement for all of memory, CPU and processes, or each group of them with its own."""
    groups: dict[str, list[str]] = {}
    for name in RESOURCES:
        groups.setdefault(_enforcement(capabilities.limits.get(name, Enforcement.NONE)), []).append(name)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{', '.join(names)}: {how}" for how, names in groups.items())


def _installed_agents(name: str, capabilities: Capabilities) -> str:
    return _yes(has_model_gateway(name) and capabilities.egress_control != EgressControl.LOOPBACK_ONLY)


FEATURES: tuple[Feature, ...] = (
    Feature(
        "task images",
        "`bases`: `image` (a task's prebuilt `docker_image`) and `Dockerfile` (a task's Dockerfile, `FROM` "
        'and all, built by the backend; see [Task images](../task-images.md)); "no": every '
        "template starts on the backend's `host` base (a cloud backend's: the provider's base image), "
        "and a task that names an image or a `FROM` is refused.",
        lambda _, c: _images(c),
    ),
    Feature(
        "resources",
        "`limits` of memory, cpu and pids: how a task's `memory` and `cpus` (and the backend's "
        "`memory_limit_mb`, `cpus`, `pids_limit`) are held: `cgroup`, `rlimit` (per process), `provider` "
        "(the cloud provider sizes the sandbox as asked; Daytona and E2B only for a task with its own image); "
        '"no": not applied (a task that asks is told so: `resources_not_applied` in its results).',
        lambda _, c: _resources(c),
    ),
    Feature(
        "storage quota",
        "`limits[\"disk\"]`: how a task's `storage` (or the backend's `disk_limit_mb`) is held, bytes "
        "and files: `tmpfs` (the sandbox's writable layer on a tmpfs of that size), `quota` (the "
        "engine's storage quota), `provider` (the cloud provider's disk size, for a task with its own image); "
        '"no": not applied.',
        lambda _, c: _enforcement(c.limits.get("disk", Enforcement.NONE)),
    ),
    Feature(
        "verification modes",
        "`verification`: the modes `sandbox.begin_verification` runs (see [Trusting the reward](../trust.md)).",
        lambda _, c: ", ".join(c.verification) or "none",
    ),
    Feature(
        "egress control",
        "`egress_control`: `proxy` (snapgym's egress proxy enforces each network policy), `provider` "
        "(the provider's own controls), `loopback-only` (no way out at all); see [Network](../network.md).",
        lambda _, c: str(c.egress_control),
    ),
    Feature(
        "egress audit",
        "`egress_audit`: `sandbox.network_log()` records every connection attempt, allowed or denied.",
        lambda _, c: _yes(c.egress_audit),
    ),
    Feature(
        "end-state changes",
        "`changes`: who lists what an episode changed (`sandbox.changes()`): the `host` (the writable "
        'layer read from outside) or the `engine`; "no": `changes()` raises UnsupportedError and a '
        "run records the end-state diff as unavailable.",
        lambda _, c: "no" if c.changes is ChangesSource.NONE else c.changes.value,
    ),
    Feature(
        "fork",
        "`fork`: `backend.fork(snapshot, n)` starts many sandboxes from one snapshot cheaply.",
        lambda _, c: _yes(c.fork),
    ),
    Feature(
        "memory snapshots",
        '`memory_snapshot`: snapshots keep running processes; "no": files only.',
        lambda _, c: _yes(c.memory_snapshot),
    ),
    Feature(
        "GPUs",
        "`gpu` and `gpu_types`: a task's `gpus` and `gpu_types` are given; elsewhere such a task is refused.",
        lambda _, c: f"yes ({len(c.gpu_types)} types)" if c.gpu and c.gpu_types else _yes(c.gpu),
        lambda c: f"GPU types: {', '.join(c.gpu_types)}." if c.gpu_types else None,
    ),
    Feature(
        "installed agents",
        "`pool.backends.has_model_gateway`, the rule by which the runner refuses `agent=claude-code|codex` "
        "(the backend takes `egress` settings, whose model gateway keeps the key outside the sandbox), "
        "and an `egress_control` that is not `loopback-only`; see [Agents](../agents.md).",
        _installed_agents,
    ),
)
"""The rows, in the order of issue 29's list."""


def declared_range(name: str) -> dict[str, Capabilities]:
    """What the backend class declares: condition -> capabilities (a fixed declaration: one entry, key "").

    Raises:
        ConfigError: the class declares nothing before it starts (it needs ``declared_capabilities`` or
            ``capability_range``, see pool.contract), or its SDK is not installed.
    """
    cls = backend_class(name)
    if isinstance(cls, DeclaresCapabilities):
        return {"": cls.declared_capabilities()}
    if isinstance(cls, DeclaresCapabilityRange):
        return dict(cls.capability_range())
    raise ConfigError(
        f"backend {name!r} declares no capabilities before it starts: give its class a declared_capabilities() "
        "or a capability_range() classmethod (pool.contract.DeclaresCapabilities, DeclaresCapabilityRange)"
    )


class _Footnotes:
    """Footnotes numbered in the order cells ask for them."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        """The superscript number of ``text`` (one number per distinct text)."""
        if text not in self.texts:
            self.texts.append(text)
        return str(self.texts.index(text) + 1).translate(_SUPERSCRIPT)


def _cell(feature: Feature, name: str, declared: Mapping[str, Capabilities], notes: _Footnotes) -> str:
    """The row's value on the backend's typical machine, then each other value its declarations give,
    marked with the footnotes of the conditions that give it; a detail's footnote last."""
    (_, typical), *others = declared.items()
    first = feature.cell(name, typical)
    values: dict[str, list[str]] = {first: []}
    for condition, capabilities in others:
        value = feature.cell(name, capabilities)
        if value != first:
            values.setdefault(value, []).append(notes.mark(f"`{name}`: {condition}"))
    text = " / ".join(value + ",".join(marks) for value, marks in values.items())
    details = dict.fromkeys(d for c in declared.values() if (d := feature.detail(c)))
    return text + "".join(notes.mark(f"`{name}`: {detail}") for detail in details)


def _stamp(entry: ConformanceResult | AttackResult) -> str:
    stamp: Stamp = entry.stamp
    commit = f" `{stamp.commit[:7]}`{'+' if stamp.dirty else ''}" if stamp.commit else ""
    return f" · {entry.where} · {stamp.date}{commit}"


def _conformance_cell(name: str, results: Results, notes: _Footnotes) -> str:
    cells = []
    for entry in results.for_backend(name)[0]:
        if entry.passed:
            text = "passed"
        else:  # the check in the cell (a "|" would end it), why in its footnote
            why = notes.mark(f"`{name}` ({entry.where}): {entry.check}: {entry.detail or 'no detail recorded'}")
            text = f"failed: {str(entry.check).replace('|', '/')}{why}"
        cells.append(text + _stamp(entry))
    return " / ".join(cells) or "not recorded"


def _attack_cell(name: str, results: Results, notes: _Footnotes) -> str:
    cells = []
    for entry in results.for_backend(name)[1]:
        counts = f"{entry.played} of {entry.cases} played, {len(entry.beat_noop)} beat no-op"
        counts += f", {len(entry.unscored)} unscored" + (f", {len(entry.failed)} failed" if entry.failed else "")
        for what, cases in (("beat the no-op agent", entry.beat_noop), ("unscored", entry.unscored),
                            ("failed otherwise", entry.failed)):  # fmt: skip
            if cases:
                counts += notes.mark(f"`{name}` ({entry.where}), {what}: {', '.join(cases)}")
        cells.append(counts + _stamp(entry))
    return " / ".join(cells) or "not recorded"


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def feature_table(names: Iterable[str] = BACKENDS, *, results: Path = RESULTS) -> str:
    """The table, its footnotes and how each row is derived, as Markdown.

    Args:
        names: the backends, one column each.
        results: the recorded results the last two rows show (:mod:`pool.testing.record`; a missing
            file: "not recorded" in every cell).

    Raises:
        ConfigError: a backend declares nothing before it starts, or its SDK is not installed, or the
            results file cannot be read (the message names it and the problem).
    """
    recorded = load_results(results)
    columns = {name: declared_range(name) for name in names}
    notes = _Footnotes()
    varies = {name: next(iter(declared)) for name, declared in columns.items() if len(declared) > 1}
    lines = [
        _row(["", *(f"`{name}`" for name in columns)]),
        _row(["---"] * (len(columns) + 1)),
        _row(["declared", *(_DECLARED[name in varies] for name in columns)]),
    ]
    for feature in FEATURES:
        lines.append(_row([feature.name, *(_cell(feature, n, d, notes) for n, d in columns.items())]))
    declared_notes = len(notes.texts)
    lines.append(_row(["conformance", *(_conformance_cell(name, recorded, notes) for name in columns)]))
    lines.append(_row(["attack catalogue", *(_attack_cell(name, recorded, notes) for name in columns)]))
    typical = "; ".join(f"`{name}`: {condition}" for name, condition in varies.items())
    lines += ["", f"Where a cell holds more than one value, the first is the typical machine's ({typical}), "
              "and each other one holds under the condition its footnote names"
              + ("; a recorded result's footnote says what failed:" if len(notes.texts) > declared_notes else ":"),
              ""]  # fmt: skip
    lines += [f"{number}. {text}" for number, text in enumerate(notes.texts, 1)]
    lines += ["", "Where each row comes from (a field of `Capabilities` unless it says otherwise):", ""]
    lines += [f"- **{feature.name}**: {feature.source}" for feature in FEATURES]
    lines += [f"- **{row}**: {source}" for row, source in RESULT_ROWS.items()]
    lines += ["", CONFORMANCE]
    return "\n".join(lines) + "\n"


def splice(document: str, table: str) -> str:
    """``document`` with ``table`` between its markers (:data:`BEGIN`, :data:`END`), the rest as it was.

    Raises:
        ConfigError: the markers are missing or out of order.
    """
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ConfigError(f"the page has no {BEGIN!r} ... {END!r} markers (in this order) to put the table between")
    return f"{document[: start + len(BEGIN)]}\n\n{table}\n{document[end:]}"
