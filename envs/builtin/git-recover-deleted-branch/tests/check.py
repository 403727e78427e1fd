"""Check /app/repo: branch recovered at the lost commit, main untouched and checked out, tree clean.

The repo is built with fixed identities and dates, so the lost commit and main's tip are fixed
hashes. git reads a neutralised copy of the repository (verifykit.Repo), never the agent's own
configuration, hooks or index bits.
"""

import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

EXPECTED = "5d6fec857d0aee4d3986d36bf1dbc33911fc443a"  # "Add caching layer to fetcher" on experiment
MAIN_TIP = "742dc65aeeb5dcb9e0f97b1abe17fef53bbe3ae6"


def check():
    repo = vk.Repo("/app/repo")
    got = repo.rev("refs/heads/recovered")
    if got is None:
        raise vk.Failure("branch recovered does not exist")
    if got != EXPECTED:
        raise vk.Failure(f"recovered points at {got}, not the lost commit")
    if repo.git("log", "-1", "--format=%s", EXPECTED).strip() != "Add caching layer to fetcher":
        raise vk.Failure("wrong commit message")
    if repo.rev("refs/heads/main") != MAIN_TIP:
        raise vk.Failure("main was moved")
    if repo.git("symbolic-ref", "-q", "HEAD", check=False).strip() != "refs/heads/main":
        raise vk.Failure("main is not checked out")
    changes = repo.worktree_changes()
    if changes:
        raise vk.Failure(f"working tree not clean:\n{changes[:2000]}")


vk.main(check, budget_s=45)
