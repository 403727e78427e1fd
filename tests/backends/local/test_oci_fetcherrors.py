"""What a failed skopeo command becomes: the cause read from its message, and the remedies that fit."""

from __future__ import annotations

import pytest

from pool.build.registry.fetcherrors import OFFLINE, explain

_EXPECTED = "sha256:" + "b" * 64
_SEEN = "sha256:" + "a" * 64


def fatal(message: str) -> str:
    """skopeo's last line for ``message``."""
    return f'time="2024-01-01T00:00:00Z" level=fatal msg="{message}"\n'


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (f"reading blob {_SEEN}: digest did not match, expected {_EXPECTED}", f"blob {_EXPECTED} as served by"),
        (f"blob {_SEEN} does not match digest", f"blob {_SEEN} as served by"),
        ("digest mismatch", "blob a blob as served by"),
        ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock", "no Docker engine could be reached"),
        ("x509: certificate signed by unknown authority", "RegistrySettings(ca_dirs="),
        ("server gave HTTP response to HTTPS client", "RegistrySettings(insecure_registries=['reg.test:5000'])"),
        ("choosing image instance: no image found in manifest list", "RegistrySettings(platform="),
        ("unauthorized: authentication required", "credentials={'reg.test:5000': Credentials(user, password)}"),
        ("manifest unknown", "was not found"),
        ("dial tcp: lookup reg.test: no such host", "mirrors={'reg.test:5000': ['mirror.example.com']}"),
    ],
)
def test_each_cause_gets_its_remedy(message: str, says: str) -> None:
    text = str(explain(fatal(message), image="app:1", host="reg.test:5000"))
    assert text.startswith("image app:1")
    assert says in text
    assert f"({message})" in text  # skopeo's own words, braces and all, stay as they were


def test_wrapping_is_removed_and_braces_are_kept() -> None:
    message = 'initializing source docker://reg.test/app:1: manifest unknown: {\\"tag\\": 1}'
    text = str(explain(fatal(message), image="app:1", host=None))
    assert text == (
        'image app:1 was not found (manifest unknown: {"tag": 1}); check its name, tag or pinned digest '
        f"(a wrong @sha256: pin is not found too); {OFFLINE}"
    )


def test_an_unknown_failure_says_what_skopeo_said() -> None:
    assert str(explain("something odd", image="app:1", host=None)) == (
        f"image app:1 could not be fetched (something odd); {OFFLINE}"
    )
    assert "skopeo gave no message" in str(explain("", image="app:1", host=None))
