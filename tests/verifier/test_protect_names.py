"""The protection removes a planted harness file whatever the bytes of its path, on every backend.

``find``'s listing used to reach Python decoded with replacement, so a ``conftest.py`` under a folder
whose name is not UTF-8 was listed under a path that named nothing, and ``rm`` left it in place for a
pytest that collects that folder. The listing now keeps the bytes, and the removal spells such names
in plain ASCII (``printf`` escapes), which every backend's command channel carries.
"""

from __future__ import annotations

import pytest

from envs.tasks.protect import ADDED_ONLY, DEFAULT_PROTECTED, KnownGood, find_listing, protect
from pool import Backend, Snapshot

ODD = "$(printf '\\377\\376')"
"""A folder name that is not UTF-8, as the agent's shell spells it."""
PLANT = " && ".join(
    [
        f'mkdir -p "/workspace/{ODD}/deep" "/workspace/x{ODD}y"',
        f'echo hook > "/workspace/{ODD}/conftest.py" && echo hook > "/workspace/{ODD}/deep/sitecustomize.py"',
        f'printf \'[tool.pytest.ini_options]\\naddopts = "-p evil"\\n\' > "/workspace/x{ODD}y/pyproject.toml"',
        "mkdir -p /workspace/plain && echo hook > /workspace/plain/conftest.py",
        "printf 'line\\n' > \"/workspace/plain/$(printf 'conftest.py')\"",
        "mkdir -p \"/workspace/nl$(printf '\\nx')\" && echo hook > \"/workspace/nl$(printf '\\nx')/conftest.py\"",
    ]
)


def test_a_harness_file_under_a_name_that_is_not_utf8_is_listed_and_removed(
    any_backend: Backend, any_snap: Snapshot
) -> None:
    with any_backend.create(any_snap) as sandbox:
        planted = sandbox.exec(PLANT)
        assert planted.exit_code == 0, planted.stderr
        listed = find_listing(sandbox, ("/workspace",), (*DEFAULT_PROTECTED, *ADDED_ONLY), inside=False)
        odd = "/workspace/\udcff\udcfe"
        assert f"{odd}/conftest.py" in listed and f"{odd}/deep/sitecustomize.py" in listed
        assert "/workspace/x\udcff\udcfey/pyproject.toml" in listed  # kept as bytes, not as U+FFFD
        done = protect(sandbox, ("/workspace",), KnownGood(DEFAULT_PROTECTED, ADDED_ONLY))
        assert {f"{odd}/conftest.py", "/workspace/plain/conftest.py", "/workspace/nl\nx/conftest.py"} <= set(
            done.removed
        )
        assert "/workspace/x\udcff\udcfey/pyproject.toml" in done.removed  # not read: removed unread
        left = sandbox.exec(
            "find /workspace \\( -name conftest.py -o -name sitecustomize.py -o -name pyproject.toml \\) | wc -l"
        )
        assert left.stdout.strip() == "0", sandbox.exec("find /workspace").stdout


@pytest.mark.parametrize("name", ["plain", "with space", "quote'd", "new\nline", "ends-in-newline\n"])
def test_ascii_names_the_removal_spells_are_the_ones_it_removes(
    any_backend: Backend, any_snap: Snapshot, name: str
) -> None:
    with any_backend.create(any_snap) as sandbox:
        folder = f"/workspace/{name}"
        made = sandbox.exec(f"mkdir -p {repr_sh(folder)} && echo hook > {repr_sh(folder + '/conftest.py')}")
        assert made.exit_code == 0, made.stderr
        done = protect(sandbox, ("/workspace",), KnownGood(DEFAULT_PROTECTED, ADDED_ONLY))
        assert f"{folder}/conftest.py" in done.removed or folder in done.removed
        assert sandbox.exec("find /workspace -name conftest.py | wc -l").stdout.strip() == "0"


def repr_sh(text: str) -> str:
    """``text`` as a single-quoted shell word (newlines kept)."""
    return "'" + text.replace("'", "'\\''") + "'"
