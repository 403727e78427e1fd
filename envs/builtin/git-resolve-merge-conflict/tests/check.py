"""Check /app/repo: a merge commit of main's and feature's tips with the specified CHANGELOG.md.

The repo is built with fixed identities and dates, so the branch tips and the expected merge tree
are fixed hashes. git reads a neutralised copy of the repository (verifykit.Repo), never the
agent's own configuration, hooks or index bits.
"""

import difflib
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

MAIN_TIP = "b9cdabc3dc81a5ece72454501bbe9caf3d448377"
FEATURE_TIP = "fd3c8346f3f78f674a6b1fa2cd9aeac917d8322c"
EXPECTED_TREE = "22a7a2873420dc5a097d763ea6340fa8ec41bc49"
GREET_BLOB = "9c5be176b7491bd6a81eca859d8dc2ad96dc5085"  # main's greet.py
FORMATS_BLOB = "b53522706b329add23045a4dcd660688ea2ca7ad"  # feature's formats.py


def check():
    repo = vk.Repo("/app/repo")
    if repo.git("symbolic-ref", "-q", "HEAD", check=False).strip() != "refs/heads/main":
        raise vk.Failure("main is not checked out")
    if vk.lstat_output("/app/repo/.git/MERGE_HEAD") is not None:
        raise vk.Failure("the merge is still in progress")
    commit, *parents = repo.git("rev-list", "--parents", "-n", "1", "HEAD").split()
    if len(parents) != 2:
        raise vk.Failure("HEAD is not a merge commit with two parents")
    if parents[0] != MAIN_TIP:
        raise vk.Failure("first parent of the merge is not the old tip of main")
    if parents[1] != FEATURE_TIP:
        raise vk.Failure("second parent of the merge is not the tip of feature")
    with open("/tests/expected_CHANGELOG.md") as f:
        expected = f.read()
    committed = repo.git("cat-file", "blob", "HEAD:CHANGELOG.md", check=False)
    if committed != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), committed.splitlines(True), "expected",
                                            "committed"))  # fmt: skip
        raise vk.Failure(f"committed CHANGELOG.md is not as specified:\n{diff[:2000]}")
    if repo.rev("HEAD:greet.py") != GREET_BLOB:
        raise vk.Failure("main's change to greet.py was lost")
    if repo.rev("HEAD:formats.py") != FORMATS_BLOB:
        raise vk.Failure("feature's formats.py was lost")
    if repo.rev("HEAD^{tree}") != EXPECTED_TREE:  # also: no conflict markers anywhere
        raise vk.Failure(f"the merge result holds other changes:\n{repo.git('diff', '--stat', MAIN_TIP, commit)}")
    changes = repo.worktree_changes()
    if changes:
        raise vk.Failure(f"working tree not clean:\n{changes[:2000]}")


vk.main(check, budget_s=45)
