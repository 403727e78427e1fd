"""The rules of a toolchain verifier's install delta (pool.verification.installs), on a Debian-like image.

The image and the agent's files are plain data here (the backends read them from their layers;
tests/backends/local/test_verification_toolchain.py runs the whole mode): what the snapshot has,
what the agent added and changed, and which rule names each path left out.
"""

from __future__ import annotations

import posixpath

from pool.verification.installs import KEPT, select

IMAGE = {
    "/usr/bin/curl", "/usr/bin/python3", "/usr/bin/sh", "/usr/local/bin/pip", "/usr/lib/x86_64-linux-gnu/libssl.so.3",
    "/usr/lib/python3.11/json/__init__.py", "/usr/local/lib/python3.11/dist-packages/numpy/__init__.py",
    "/usr/local/lib/python3.11/dist-packages/numpy-2.3.0.dist-info/RECORD", "/usr/lib/node_modules/npm/index.js",
    "/etc/apt/sources.list",
}  # fmt: skip
SITE = "/usr/local/lib/python3.11/dist-packages"


class Image:
    """The known-good snapshot: these files and the folders above them."""

    def __init__(self, files: set[str]) -> None:
        self.files = files
        self.folders = {parent for f in files for parent in _parents(f)}

    def kind(self, path: str) -> str | None:
        return "file" if path in self.files else "dir" if path in self.folders else None

    def names(self, path: str) -> frozenset[str]:
        return frozenset(p[len(path) + 1 :].split("/")[0] for p in self.files if p.startswith(path + "/"))


class Agent:
    """The agent's end state: file contents and link targets."""

    def __init__(self, files: dict[str, bytes], links: dict[str, str] | None = None) -> None:
        self.files, self.links = files, links or {}

    def read(self, path: str) -> bytes | None:
        return self.files.get(path)

    def readlink(self, path: str) -> str | None:
        return self.links.get(path)

    def is_plain(self, path: str) -> bool:
        return not path.endswith(".fifo")


def _parents(path: str) -> list[str]:
    found = []
    while (path := posixpath.dirname(path)) != "/":
        found.append(path)
    return found


def judge(
    files: dict[str, bytes], links: dict[str, str] | None = None, changed: tuple[str, ...] = ()
) -> dict[str, str]:
    delta = select([*files, *(links or {})], Image(IMAGE), Agent(files, links), changed=changed, path="/usr/bin")
    return {**dict.fromkeys(delta.grafted, "grafted"), **dict(delta.dropped)}


def test_a_replaced_curl_and_a_shadow_of_it_stay_behind_and_a_new_command_comes():
    found = judge({"/usr/local/bin/curl": b"forged", "/usr/bin/cobc": b"elf"}, changed=("/usr/bin/curl",))
    assert found == {
        "/usr/bin/curl": KEPT,
        "/usr/local/bin/curl": "shadows the known-good command 'curl' on PATH",
        "/usr/bin/cobc": "grafted",
    }


def test_python_installs_go_unless_they_hook_shadow_or_upgrade():
    record = b"numpy/__init__.py,,\nnumpy/new.py,,\n../../../bin/f2py,,\n"
    found = judge({
        f"{SITE}/sgeigen/__init__.py": b"", f"{SITE}/sgeigen-1.0.dist-info/RECORD": b"sgeigen/__init__.py,,\n",
        f"{SITE}/evil.pth": b"import os", f"{SITE}/json.py": b"", f"{SITE}/pytest_forge/__init__.py": b"",
        f"{SITE}/numpy/new.py": b"", f"{SITE}/numpy-2.4.0.dist-info/RECORD": record,
        "/usr/lib/python3.11/sitecustomize.py": b"",
    })  # fmt: skip
    assert found == {
        f"{SITE}/sgeigen/__init__.py": "grafted",
        f"{SITE}/sgeigen-1.0.dist-info/RECORD": "grafted",
        f"{SITE}/evil.pth": "a start-up hook (*.pth) that every Python would run",
        f"{SITE}/json.py": "shadows the standard-library module 'json'",
        f"{SITE}/pytest_forge": "shadows the verifier's own tool 'pytest_forge' (a verifier's install would keep it)",
        f"{SITE}/numpy": found[f"{SITE}/numpy-2.4.0.dist-info"],
        f"{SITE}/numpy-2.4.0.dist-info": "an upgrade of the distribution 'numpy', which the snapshot has "
        "(numpy-2.3.0.dist-info): all its files dropped",
        "/usr/lib/python3.11/sitecustomize.py": "a start-up hook (sitecustomize/usercustomize) that every Python "
        "would run",
    }


def test_a_pytest_plugin_goes_with_every_module_it_names():
    found = judge({
        f"{SITE}/helper-1.0.dist-info/entry_points.txt": b"[pytest11]\nhelper = helper_mod.plugin\n",
        f"{SITE}/helper_mod/plugin.py": b"",
    })  # fmt: skip
    why = "the distribution 'helper' is a pytest plugin (pytest11 entry point): all its files dropped"
    assert found == {f"{SITE}/helper-1.0.dist-info": why, f"{SITE}/helper_mod": why}


def test_libraries_etc_node_modules_and_links():
    found = judge(
        {
            "/usr/local/lib/libssl.so.3": b"elf", "/usr/lib/x86_64-linux-gnu/libcob.so.4": b"elf",
            "/etc/ld.so.conf.d/zz.conf": b"/opt", "/etc/gnucobol/default.conf": b"", "/etc/apt/apt.conf.d/x": b"",
            "/usr/lib/node_modules/npm/npmrc": b"", "/usr/lib/node_modules/left-pad/index.js": b"",
            "/opt/x/pipe.fifo": b"",
        },
        links={"/opt/x/passwd": "/etc/passwd", "/opt/x/lib": "../../usr/lib/x86_64-linux-gnu/libcob.so.4"},
    )  # fmt: skip
    assert found == {
        "/usr/local/lib/libssl.so.3": "shadows the known-good library 'libssl.so.3'",
        "/usr/lib/x86_64-linux-gnu/libcob.so.4": "grafted",
        "/etc/ld.so.conf.d": "/etc: configuration of the loader, shells or the verifier's tools",
        "/etc/gnucobol/default.conf": "grafted",
        "/etc/apt": "/etc: configuration of the loader, shells or the verifier's tools",
        "/usr/lib/node_modules/npm": "changes a package the snapshot's node_modules has",
        "/usr/lib/node_modules/left-pad/index.js": "grafted",
        "/opt/x/passwd": "a link that leads outside the install roots (-> /etc/passwd): not followed, not grafted",
        "/opt/x/lib": "grafted",
        "/opt/x/pipe.fifo": "not a regular file, folder or link",
    }
