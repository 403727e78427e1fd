"""The link resolver of the cloud backends' audit judges links as the C audit does (csrc/linkaudit.c)."""

from __future__ import annotations

from pathlib import Path

from pool.verification import VerificationPlan, VerifyMode, leads_into, protected_tops

PROTECTED = protected_tops(VerificationPlan(VerifyMode.STRICT, Path("/t"), outputs=("/app/out",)))


def _judge(link: str, target: str, links: dict[str, str | None]) -> bool:
    known = dict(links)
    for _ in range(100):
        answer = leads_into(link, target, PROTECTED, known)
        if isinstance(answer, bool):
            return answer
        known.update((path, None) for path in answer if path not in known)
    raise AssertionError("no verdict")


def test_protected_places_are_proc_sys_and_the_private_top_levels() -> None:
    assert {"proc", "sys", "tests", "logs"} == PROTECTED


def test_a_link_is_judged_by_every_place_it_passes_through() -> None:
    assert _judge("/app/out/a", "/tests/expected.txt", {})
    assert _judge("/app/out/a", "../../../logs", {})
    assert _judge("/app/out/a", "/tests/../etc/passwd", {})  # passes through /tests on the way
    assert not _judge("/app/out/a", "b/c", {})
    assert not _judge("/app/out/a", "/etc/passwd", {})


def test_links_on_the_way_are_followed_and_loops_end() -> None:
    assert _judge("/app/out/a", "b", {"/app/out/b": "/usr/x", "/usr/x": "../../tests"})
    assert not _judge("/app/out/a", "b", {"/app/out/b": "../out/b"})  # a loop: no protected place


def test_unknown_paths_are_asked_for_with_those_after_them() -> None:
    assert leads_into("/app/out/a", "x/y/z", PROTECTED, {}) == ("/app/out/x", "/app/out/x/y", "/app/out/x/y/z")
