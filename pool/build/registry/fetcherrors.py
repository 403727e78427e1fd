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
from dataclasses import dataclass

from pool.errors import ImageError, RegistryUnreachableError

_MSG = re.compile(r'level=fatal msg="((?:[^"\\]|\\.)*)"')
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_EXPECTED = re.compile(r"expected (sha256:[0-9a-f]{64})")
# skopeo's wrapping around the cause, which names the image again (and calls any failure a parse error)
_PREFIX = re.compile(r'^(?:Error parsing image name "[^"]*"|initializing source \S+): ')

OFFLINE = (
    "or provide the image without the registry: `docker save IMAGE -o image.tar` where it exists, then use "
    "'docker-archive:/path/image.tar', or an OCI layout 'oci:/path/layout:tag' (e.g. made with `skopeo copy`): "
    "on the runner's command line suite.images='[\"IMAGE=docker-archive:/path/image.tar\"]', in Python "
    "bases={IMAGE: 'docker-archive:/path/image.tar'}"
)


def explain(stderr: str, *, image: str, host: str | None) -> ImageError:
    """The ImageError for skopeo's ``stderr`` when fetching ``image`` (from registry ``host``, if one)."""
    detail = _detail(stderr)
    lowered = detail.lower()
    for cause in _CAUSES:
        if any(word in lowered for word in cause.words):
            where = host or "the registry"
            text = cause.message.format(image=image, where=where, detail=detail, blob=_blob(detail), offline=OFFLINE)
            return cause.error(text)
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


def _blob(detail: str) -> str:
    """The digest of the blob a message names (the one it expected, if it says), else "a blob"."""
    expected = _EXPECTED.search(detail)
    if expected:
        return expected.group(1)
    named = _DIGEST.search(detail)
    return named.group(0) if named else "a blob"


@dataclass(frozen=True, slots=True)
class _Cause:
    """One kind of failure: words of skopeo's message that reveal it, and what to say then."""

    words: tuple[str, ...]
    """Lowercase fragments; the first cause one of whose words the message holds is taken."""
    message: str
    """A ``str.format`` template over ``image``, ``where`` (the registry), ``detail`` (skopeo's words),
    ``blob`` (a digest it names) and ``offline`` (:data:`OFFLINE`)."""
    error: type[ImageError] = ImageError


_CAUSES = (
    _Cause(
        words=("digest did not match", "does not match digest", "digest mismatch", "does not match the digest"),
        message="image {image}: blob {blob} as served by {where} differs from its digest ({detail}); the source's "
        "copy is damaged (or changed in transit): push the image to the registry again, fetch it through a mirror, "
        "{offline}",
    ),
    _Cause(
        words=("cannot connect to the docker daemon", "docker.sock"),
        message="image {image}: no Docker engine could be reached ({detail}); docker-daemon: sources need a running "
        "engine (DOCKER_HOST or /var/run/docker.sock): start one, or `docker save` the image elsewhere and use "
        "'docker-archive:/path/image.tar'",
    ),
    _Cause(
        words=("x509", "certificate"),
        message="image {image}: the certificate of {where} is not trusted ({detail}); trust its CA with "
        "RegistrySettings(ca_dirs=[folder holding ca.crt]), or, for a test registry, "
        "RegistrySettings(insecure_registries=[{where!r}]); {offline}",
    ),
    _Cause(
        words=("http response to https client",),
        message="image {image}: {where} speaks plain HTTP ({detail}); allow it with "
        "RegistrySettings(insecure_registries=[{where!r}])",
    ),
    _Cause(
        words=("no image found in manifest list", "choosing image instance", "choosing an image from manifest"),
        message="image {image} has no variant for the requested platform ({detail}); pick one it has with "
        "RegistrySettings(platform='linux/arm64') or similar",
    ),
    _Cause(
        words=("unauthorized", "authentication required", "denied", "incorrect username", "invalid username"),
        message="image {image}: {where} refused access ({detail}); the image may also not exist, as registries "
        "answer the same for both. Give credentials: RegistrySettings(credentials={{{where!r}: Credentials(user, "
        "password)}}) or auth_file=~/.docker/config.json after `docker login {where}`; {offline}",
    ),
    _Cause(
        words=(
            "manifest unknown",
            "name unknown",
            "not found",
            "no descriptor found",
            "no such file",
            "does not exist",
            "no such image",
        ),
        message="image {image} was not found ({detail}); check its name, tag or pinned digest (a wrong "
        "@sha256: pin is not found too); {offline}",
    ),
    _Cause(
        words=(
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
        message="image {image}: {where} cannot be reached ({detail}); check the network, configure a mirror "
        "(on the runner's command line backend.registry.mirrors='{{{where}: [mirror.example.com]}}', in Python "
        "RegistrySettings(mirrors={{{where!r}: ['mirror.example.com']}})), {offline}",
        error=RegistryUnreachableError,
    ),
)
