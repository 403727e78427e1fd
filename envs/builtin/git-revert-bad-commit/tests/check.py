"""Check /app/repo: one new commit on main that reverts exactly the bad commit, tree clean.

Expected hashes are fixed: the repo is built with fixed identities and dates. git reads a
neutralised copy of the repository (verifykit.Repo), never the agent's own configuration, hooks or
index bits; the reverted inventory.py runs only in an untrusted child.
"""

import os
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

ORIGINAL_TIP = "73d5d14b7cddfc5785c50f3145e1a63e29b4edbe"
BAD_COMMIT = "f621507dcff94ea42a2d7e7ba98d84207333780f"
EXPECTED_TREE = "8e30c4832f52f3a9f4d8438387eed1ae670dfe33"
ITEMS = [
    {"name": "bolt", "price": 2, "qty": 10},
    {"name": "nut", "price": 1, "qty": 3},
    {"name": "gear", "price": 7, "qty": 25},
]
DRIVER = """
import inventory
report([inventory.total_value(PAYLOAD), inventory.restock_plan(PAYLOAD), inventory.low_stock(PAYLOAD)])
"""


def check():
    repo = vk.Repo("/app/repo")
    if repo.git("symbolic-ref", "-q", "HEAD", check=False).strip() != "refs/heads/main":
        raise vk.Failure("main is not checked out")
    head = repo.rev("HEAD")
    if head is None:
        raise vk.Failure("no HEAD")
    if head == ORIGINAL_TIP:
        raise vk.Failure("no new commit on main")
    parents = repo.git("rev-list", "--parents", "-n", "1", "HEAD").split()[1:]
    if len(parents) != 1:
        raise vk.Failure("HEAD must have exactly one parent")
    if parents[0] != ORIGINAL_TIP:
        raise vk.Failure("the parent of HEAD is not the original tip of main")
    if not repo.succeeds("merge-base", "--is-ancestor", BAD_COMMIT, "HEAD"):
        raise vk.Failure("history was rewritten")
    changes = repo.worktree_changes()
    if changes:
        raise vk.Failure(f"working tree is not clean:\n{changes[:2000]}")
    if repo.rev("HEAD^{tree}") != EXPECTED_TREE:
        diff = repo.git("diff", "--no-ext-diff", "--no-textconv", f"{ORIGINAL_TIP}", head)
        raise vk.Failure(f"HEAD's content is not the original tip with the bad commit reverted:\n{diff[:2000]}")

    # Behaviour of the committed inventory.py, run as the untrusted user.
    box = vk.untrusted_dir()
    with open(os.path.join(box, "inventory.py"), "w") as f:
        f.write(repo.git("cat-file", "blob", "HEAD:inventory.py"))
    os.chmod(os.path.join(box, "inventory.py"), 0o644)
    got = vk.run_python(DRIVER, ITEMS, path=box, timeout_s=20)
    if got != [198, {"bolt": 10, "nut": 17}, ["nut"]]:
        raise vk.Failure(f"behaviour check failed: total_value, restock_plan, low_stock gave {got}")


vk.main(check, budget_s=45)
