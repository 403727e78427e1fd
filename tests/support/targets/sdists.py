"""Source distributions of real projects that some tests build tasks from, fetched before the tests run.

The SWE-bench-shaped tasks (:mod:`tests.support.targets.swe_targets`, the attack targets, and
:mod:`tests.support.targets.swe_projects`, the verifier's real-project tests) are made from the sdists
of small open-source libraries (their source, their own tests, ``conftest.py`` and pytest
options). Tests never reach the internet: ``.ci/run`` runs ``python -m tests.support.targets.sdists``
first, which downloads each pinned sdist with pip into :func:`cache_dir` and checks its SHA-256;
a test that needs one it lacks skips (a failure under ``SNAPGYM_REQUIRE_ALL=1``) naming that
command. No third-party source is kept in this repository.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = Path(os.environ.get("SNAPGYM_SDIST_CACHE", "/var/cache/snapgym-tests/sdists"))
"""Where the sdists are kept (``SNAPGYM_SDIST_CACHE`` moves it)."""
FETCH_COMMAND = "python -m tests.support.targets.sdists"


@dataclass(frozen=True, slots=True)
class Sdist:
    """One pinned source distribution of the package index."""

    project: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        """``project==version``, as pip reads it."""
        return f"{self.project}=={self.version}"


CLICK = Sdist(
    "click", "8.1.7", "click-8.1.7.tar.gz", "ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de"
)
"""Pallets' click (BSD-3-Clause): ``tests/conftest.py`` with a fixture, ``setup.cfg [tool:pytest]``."""
MARKUPSAFE = Sdist(
    "markupsafe", "2.1.5", "MarkupSafe-2.1.5.tar.gz", "d283d37a890ba4c1ae73ffadf8046435c76e7bc2247bbb63c00bd1a709c6544b"
)
"""Pallets' MarkupSafe (BSD-3-Clause): session-scoped parametrized fixtures in ``tests/conftest.py``,
``filterwarnings = error`` in ``setup.cfg``, an optional C extension the tests skip when not built."""
SIX = Sdist("six", "1.16.0", "six-1.16.0.tar.gz", "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926")
"""six (MIT): its pytest options are a ``[tool:pytest]`` section of ``setup.cfg``."""
MORE_ITERTOOLS = Sdist(
    "more-itertools",
    "10.5.0",
    "more-itertools-10.5.0.tar.gz",
    "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6",
)
"""more-itertools (MIT): ``tests/`` is a package; ``tox.ini`` and ``setup.cfg``."""
TOOLZ = Sdist(
    "toolz", "1.0.0", "toolz-1.0.0.tar.gz", "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02"
)
"""toolz (BSD-3-Clause): its tests live inside the package."""
PINNED: tuple[Sdist, ...] = (CLICK, MARKUPSAFE, SIX, MORE_ITERTOOLS, TOOLZ)


def cache_dir() -> Path:
    """The cache folder (made if missing)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    return CACHE_DIR


def cached(sdist: Sdist) -> Path | None:
    """The cached file of ``sdist`` if it is there with the pinned digest, else None (never fetches)."""
    path = CACHE_DIR / sdist.filename
    if path.is_file() and _sha256(path) == sdist.sha256:
        return path
    return None


def fetch(sdist: Sdist) -> Path:
    """Download ``sdist`` into the cache with pip, unless it is there; check its digest.

    Raises:
        RuntimeError: pip failed, or the file's digest is not the pinned one.
    """
    if (path := cached(sdist)) is not None:
        return path
    folder = cache_dir()
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    done = subprocess.run([*args, sdist.requirement, "-d", str(folder)], capture_output=True, text=True, check=False)
    path = folder / sdist.filename
    if done.returncode != 0 or not path.is_file():
        raise RuntimeError(f"pip download {sdist.requirement} failed ({done.returncode}): {done.stderr[-2000:]}")
    if (digest := _sha256(path)) != sdist.sha256:
        path.unlink()
        raise RuntimeError(f"{sdist.filename}: SHA-256 {digest}, pinned {sdist.sha256}: not the release pinned here")
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    """Fetch every pinned sdist (``.ci/run`` does this before the tests)."""
    for sdist in PINNED:
        print(f"{sdist.requirement}: {fetch(sdist)}")


if __name__ == "__main__":
    main()
