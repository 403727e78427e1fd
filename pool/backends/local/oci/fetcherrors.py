"""What a failed skopeo command means, as an ImageError that says how to provide the image.

skopeo reports one ``level=fatal msg="..."`` line; the cause is recognised from
its wording (the Go errors of containers/image and of the registry's API), and
the message names the image, the cause in skopeo's words, and the remedies
that fit: credentials, a mirror, the plain-HTTP or CA settings, or providing the
image as a file (``docker save`` + ``docker-archive:``, an OCI layout).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from pool.errors import ImageError

_MSG = re.compile(r'level=fatal msg="((?:[^"\\]|\\.)*)"')
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_EXPECTED = re.compile(r"expected (sha256:[0-9a-f]{64})")
# skopeo's wrapping around the cause, which names the image again (and calls any failure a parse error)
_PREFIX = re.compile(r'^(?:Error parsing image name "[^"]*"|initializing source \S+): ')

OFFLINE = (
    "or provide the image without the registry: `docker save IMAGE -o image.tar` where it exists, then use "
    "'docker-archive:/path/image.tar', or an OCI layout 'oci:/path/layout:tag' (e.g. made with `skopeo copy`)"
)


def explain(stderr: str, *, image: str, host: str | None) -> ImageError:
    """The ImageError for skopeo's ``stderr`` when fetching ``image`` (from registry ``host``, if one)."""
    detail = _detail(stderr)
    lowered = detail.lower()
    where = host or "the registry"
    for words, describe in _CAUSES:
        if any(word in lowered for word in words):
            return ImageError(describe(image, where, detail))
    return ImageError(f"image {image} could not be fetched ({detail}); {OFFLINE}")


def _detail(stderr: str) -> str:
    found = _MSG.findall(stderr)
    if not found:
        return stderr.strip()[-2000:] or "skopeo gave no message"
    try:
        message = str(json.loads(f'"{found[-1]}"'))
    except ValueError:
        message = str(found[-1])
    return _PREFIX.sub("", message)


def _corrupt(image: str, where: str, detail: str) -> str:
    blob = _EXPECTED.search(detail) or _DIGEST.search(detail)
    name = blob.group(1 if blob.re is _EXPECTED else 0) if blob else "a blob"
    return (
        f"image {image}: blob {name} as served by {where} differs from its digest ({detail}); the source's copy is "
        f"damaged (or changed in transit): push the image to the registry again, fetch it through a mirror, {OFFLINE}"
    )


def _no_daemon(image: str, where: str, detail: str) -> str:
    return (
        f"image {image}: no Docker engine could be reached ({detail}); docker-daemon: sources need a running engine "
        "(DOCKER_HOST or /var/run/docker.sock): start one, or `docker save` the image elsewhere and use "
        "'docker-archive:/path/image.tar'"
    )


def _tls(image: str, where: str, detail: str) -> str:
    return (
        f"image {image}: the certificate of {where} is not trusted ({detail}); trust its CA with "
        f"RegistrySettings(ca_dirs=[folder holding ca.crt]), or, for a test registry, "
        f"RegistrySettings(insecure_registries=[{where!r}]); {OFFLINE}"
    )


def _plain_http(image: str, where: str, detail: str) -> str:
    return (
        f"image {image}: {where} speaks plain HTTP ({detail}); allow it with "
        f"RegistrySettings(insecure_registries=[{where!r}])"
    )


def _platform(image: str, where: str, detail: str) -> str:
    return (
        f"image {image} has no variant for the requested platform ({detail}); pick one it has with "
        "RegistrySettings(platform='linux/arm64') or similar"
    )


def _auth(image: str, where: str, detail: str) -> str:
    return (
        f"image {image}: {where} refused access ({detail}); the image may also not exist, as registries answer "
        f"the same for both. Give credentials: RegistrySettings(credentials={{{where!r}: Credentials(user, "
        f"password)}}) or auth_file=~/.docker/config.json after `docker login {where}`; {OFFLINE}"
    )


def _not_found(image: str, where: str, detail: str) -> str:
    return (
        f"image {image} was not found ({detail}); check its name, tag or pinned digest (a wrong "
        f"@sha256: pin is not found too); {OFFLINE}"
    )


def _unreachable(image: str, where: str, detail: str) -> str:
    return (
        f"image {image}: {where} cannot be reached ({detail}); check the network, configure a mirror with "
        f"RegistrySettings(mirrors={{{where!r}: ['mirror.example.com']}}), {OFFLINE}"
    )


_CAUSES: tuple[tuple[tuple[str, ...], Callable[[str, str, str], str]], ...] = (
    (("digest did not match", "does not match digest", "digest mismatch", "does not match the digest"), _corrupt),
    (("cannot connect to the docker daemon", "docker.sock"), _no_daemon),
    (("x509", "certificate"), _tls),
    (("http response to https client",), _plain_http),
    (("no image found in manifest list", "choosing image instance", "choosing an image from manifest"), _platform),
    (("unauthorized", "authentication required", "denied", "incorrect username", "invalid username"), _auth),
    (
        (
            "manifest unknown",
            "name unknown",
            "not found",
            "no descriptor found",
            "no such file",
            "does not exist",
            "no such image",
        ),
        _not_found,
    ),
    (
        (
            "connection refused",
            "no such host",
            "i/o timeout",
            "network is unreachable",
            "deadline exceeded",
            "handshake timeout",
            "connection reset",
            "server misbehaving",
            "dial tcp",
            "eof",
        ),
        _unreachable,
    ),
)
