"""Which Debian packages the host userland has, for the ``host`` base."""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

DPKG_STATUS = Path("/var/lib/dpkg/status")


@lru_cache(maxsize=1)
def installed_packages(status_file: Path = DPKG_STATUS) -> frozenset[str] | None:
    """Names of installed packages from dpkg's database, or None on a host without dpkg."""
    try:
        text = status_file.read_text(errors="replace")
    except OSError:
        return None
    installed: set[str] = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            installed.add(fields["Package"])
            for provided in fields.get("Provides", "").split(","):
                if provided.strip():
                    installed.add(provided.strip().split()[0])
    return frozenset(installed)


def missing_host_packages(packages: list[str]) -> list[str]:
    """The packages not installed on the host.

    Without a dpkg database, a package counts as present when a command of the
    same name is on PATH.
    """
    installed = installed_packages()
    if installed is None:
        return [p for p in packages if shutil.which(p) is None]
    return [p for p in packages if p not in installed]
