"""The public API: complete exports, one error tree, clear errors on bad input."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import pool
from pool import (
    ConfigError,
    LocalBackend,
    SnapgymError,
    Snapshot,
    SnapshotError,
    SnapshotNotFoundError,
    Template,
    load_backend,
)
from pool.contract import Backend, Sandbox


def test_all_is_complete_and_importable() -> None:
    public = {name for name, obj in vars(pool).items() if not name.startswith("_") and not inspect.ismodule(obj)}
    assert public <= set(pool.__all__) | {"annotations"}
    for name in pool.__all__:
        assert hasattr(pool, name)


def test_every_error_is_under_one_base() -> None:
    errors = [obj for obj in vars(pool).values() if inspect.isclass(obj) and issubclass(obj, Exception)]
    assert errors and all(issubclass(e, SnapgymError) for e in errors)


def test_local_backend_satisfies_the_contract(backend: LocalBackend, snap: Snapshot) -> None:
    assert isinstance(backend, Backend)
    with backend.create(snap) as sandbox:
        assert isinstance(sandbox, Sandbox)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": ""}, "name"),
        ({"name": "t", "setup": "echo one string"}, "list of commands"),
        ({"name": "t", "workdir": "relative"}, "absolute"),
        ({"name": "t", "files": {"rel": "x"}}, "absolute"),
        ({"name": "t", "env": {"A=B": "x"}}, "variable name"),
    ],
)
def test_bad_templates_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Template(**kwargs)  # type: ignore[arg-type]


def test_bad_backend_options_and_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="memory_limit_mb"):
        LocalBackend(store_dir=tmp_path, memory_limit_mb=-1)
    with pytest.raises(ConfigError, match=r"choose one of: daytona, docker, e2b, local, modal; did you mean 'local'\?"):
        load_backend("lcoal")
    with pytest.raises(ConfigError, match=r"no option 'memory_limt_mb' \(did you mean 'memory_limit_mb'\?\)"):
        load_backend("local", memory_limt_mb=512)
    with pytest.raises(ConfigError, match=r"its options are: .*prefer_prebuilt"):
        load_backend("local", bogus=1)
    with pytest.raises(ConfigError, match="not with a backend instance"):
        load_backend(LocalBackend(store_dir=tmp_path), memory_limit_mb=1)


def test_missing_and_foreign_snapshots(backend: LocalBackend, snap: Snapshot) -> None:
    with pytest.raises(SnapshotNotFoundError, match="build its template first"):
        backend.get_snapshot("nope")
    foreign = Snapshot(id="x", digest="y", backend="e2b")
    with pytest.raises(SnapshotError, match="belongs to the 'e2b' backend"):
        backend.create(foreign)
    assert backend.get_snapshot(snap.id) == snap


def test_template_hash_changes_with_content() -> None:
    a = Template(name="t", setup=["echo a"])
    assert a.content_hash("base") == Template(name="t", setup=["echo a"]).content_hash("base")
    assert a.content_hash("base") != Template(name="t", setup=["echo b"]).content_hash("base")
    assert a.content_hash("base") != a.content_hash("other-base")


def test_optional_features_are_found_by_protocol() -> None:
    """What each backend offers beyond the contract, as its optional Protocols see it."""
    from pool.backends import backend_class
    from pool.contract import (
        DeclaresCapabilities,
        DeclaresCapabilityRange,
        KeepsRunCheckpoints,
        ReapsLabelled,
        ReapsRuns,
    )

    def offers(name: str) -> set[str]:
        cls = backend_class(name)
        declares = {"declared_capabilities": DeclaresCapabilities, "capability_range": DeclaresCapabilityRange}
        found = {feature for feature, protocol in declares.items() if isinstance(cls, protocol)}
        protocols = {"reap_run": ReapsRuns, "reap_labelled": ReapsLabelled, "keep_run_checkpoints": KeepsRunCheckpoints}
        return found | {feature for feature, protocol in protocols.items() if issubclass(cls, protocol)}

    assert offers("local") == {"capability_range"}
    assert offers("docker") == {"capability_range", "reap_run", "keep_run_checkpoints"}
    for cloud in ("e2b", "daytona", "modal"):
        assert offers(cloud) == {"declared_capabilities", "reap_run", "reap_labelled"}
