"""The signature test: nothing an episode does survives into the next one."""

from __future__ import annotations

from pool import Backend, LocalBackend, Snapshot

DIRTY_EPISODE = """
echo leak > /tmp/leak
echo leak > /dev/shm/leak
echo leak > /workspace/leak
echo 'export LEAKED_VAR=1' >> /root/.bashrc
echo 'export LEAKED_VAR=1' >> /root/.profile
mkdir -p /etc/profile.d && echo 'export LEAKED_VAR=1' > /etc/profile.d/leak.sh
(setsid sh -c 'while true; do sleep 1; done' >/dev/null 2>&1 &)
nohup sleep 1000 >/dev/null 2>&1 &
python3 -c "import sysv_ipc" 2>/dev/null || true
hostname 2>/dev/null
"""

PROBE = """
for f in /tmp/leak /dev/shm/leak /workspace/leak /etc/profile.d/leak.sh; do test -e $f && echo "file $f"; done
bash -lc 'test -n "$LEAKED_VAR" && echo "login env"'
bash -ic 'test -n "$LEAKED_VAR" && echo "interactive env"' 2>/dev/null
ps -eo pid,args | awk 'NR>1 && $1 != 1' \\
  | grep -v -e 'ps -eo' -e awk -e grep -e '^ *[0-9]* sh -c' -e bash -e snapgym- || true
"""


def test_files_processes_and_shell_state_are_gone_after_restore(any_backend: Backend, any_snap: Snapshot) -> None:
    with any_backend.create(any_snap) as sandbox:
        sandbox.exec(DIRTY_EPISODE)
        before = sandbox.exec(PROBE).stdout
        assert "file /tmp/leak" in before and "sleep 1000" in before  # the probe sees the dirt
        sandbox.restore()
        after = sandbox.exec(PROBE)
        assert after.stdout == "", f"state leaked into the next episode:\n{after.stdout}"
        assert sandbox.exec("cat /workspace/a").stdout == "hi\n"


def test_two_episodes_start_from_the_same_digest(any_backend: Backend, any_snap: Snapshot) -> None:
    first = any_backend.create(any_snap)
    second = any_backend.create(any_snap)
    try:
        first.exec("echo changed > /workspace/a")
        first.restore()
        assert first.start_digest == second.start_digest == any_snap.digest
        listing = "find / -xdev -path /proc -prune -o -print | sort | md5sum"
        assert first.exec(listing).stdout == second.exec(listing).stdout
    finally:
        first.close()
        second.close()


def test_snapshot_digest_is_reproducible_and_verifiable(backend: LocalBackend, snap: Snapshot) -> None:
    assert backend.verify(snap)
    with backend.create(snap) as sandbox:
        sandbox.write_file("/workspace/x", b"same content")
        one = sandbox.snapshot()
        sandbox.restore(snap)
        sandbox.write_file("/workspace/x", b"same content")
        two = sandbox.snapshot()
    assert one.digest == two.digest and one.id == two.id
    assert one.parent == snap.id
    assert backend.verify(one)
