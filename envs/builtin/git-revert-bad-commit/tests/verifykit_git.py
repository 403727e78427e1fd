"""verifykit_git: ask git about an agent's repository without running anything the repository says to run.

Identical copies live in the tests/ of the built-in git tasks, next to verifykit.py. Git runs
commands named in a repository's own files: core.fsmonitor, diff.external, textconv and filter
drivers, hooks, replace refs that swap objects, an index whose bits hide changes from
``git status``. So git never sees the agent's .git: Repo copies only its objects, refs, HEAD and
index into a private folder (a symbolic link or special file there is a failure), gives the copy
a fixed configuration and runs git as root on that copy, with no system or global configuration,
no replace objects, hooks off. The working tree is judged against a fresh index built from HEAD,
so every file is hashed; nothing the agent's index says about it is believed.
"""

from __future__ import annotations

import os
import stat

import verifykit as vk

_COPIED = ("HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "ORIG_HEAD", "index", "packed-refs")
_COPIED_DIRS = ("refs", "objects")
_MAX_FILE_BYTES = 16 << 20
_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"


class Repo:
    """A private, neutralised copy of the repository whose working tree is ``worktree``."""

    def __init__(self, worktree: str, *, max_bytes: int = 64 << 20, max_entries: int = 20_000) -> None:
        self.worktree = worktree
        self.agent_git_dir = os.path.join(worktree, ".git")
        st = vk.lstat_output(self.agent_git_dir)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise vk.Failure(f"{self.agent_git_dir} is not a directory")
        for name in ("commondir", "objects/info/alternates"):
            if vk.lstat_output(os.path.join(self.agent_git_dir, name)) is not None:
                raise vk.Failure(f"{self.agent_git_dir}/{name} borrows another repository")
        self.git_dir = os.path.join(vk.private_dir(), "git")
        self._budget = [max_bytes, max_entries]
        os.mkdir(self.git_dir)
        for name in _COPIED:
            self._copy(name, directory=False)
        for name in _COPIED_DIRS:
            self._copy(name, directory=True)
        os.makedirs(os.path.join(self.git_dir, "refs", "heads"), exist_ok=True)
        with open(os.path.join(self.git_dir, "config"), "w") as f:
            f.write(_CONFIG)

    def git(self, *args: str, worktree: bool = False, check: bool = True, timeout_s: float = 15) -> str:
        """git's stdout; a non-zero exit is a Failure unless ``check`` is false (then stdout is "")."""
        result = vk.run_trusted(self._argv(args), cwd=self.worktree if worktree else self.git_dir,
                                timeout_s=timeout_s, env=self._env(worktree=worktree))  # fmt: skip
        if result.timed_out:
            raise vk.Failure(f"git {args[0]} did not finish within {timeout_s:g} s")
        if result.returncode != 0:
            if check:
                raise vk.Failure(f"git {' '.join(args)} failed: {result.text(500)}")
            return ""
        return result.stdout.decode("utf-8", "replace")

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
                "-c", "core.useReplaceRefs=false", "-c", "core.untrackedCache=false", *args]  # fmt: skip

    def _env(self, *, worktree: bool) -> dict[str, str]:
        env = {
            "GIT_DIR": self.git_dir,
            "HOME": self.git_dir,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_PAGER": "cat",
        }
        if worktree:
            env["GIT_WORK_TREE"] = self.worktree
        return env

    def succeeds(self, *args: str) -> bool:
        """Whether git exits with status 0 (for the commands that answer with it)."""
        argv = self._argv(args)
        result = vk.run_trusted(argv, cwd=self.git_dir, timeout_s=15, env=self._env(worktree=False))
        return not result.timed_out and result.returncode == 0

    def rev(self, spec: str) -> str | None:
        """The object id ``spec`` names, or None."""
        return self.git("rev-parse", "-q", "--verify", "--end-of-options", spec, check=False).strip() or None

    def worktree_changes(self) -> str:
        """``git status`` lines for everything that differs from HEAD: staged, modified, untracked, ignored.

        Empty means clean. Staged changes come from the agent's index (compared by object id
        only); the working tree is compared with a fresh index read from HEAD.
        """
        if any(line.startswith("160000 ") for line in self.git("ls-files", "--stage").splitlines()):
            return "the index holds a submodule"
        staged = self.git("diff-index", "--cached", "--name-status", "--no-renames", "HEAD", "--")
        if staged.strip():
            return staged
        for relative, st in vk.walk_output(self.worktree, max_entries=50_000).items():
            if stat.S_ISREG(st.st_mode) and st.st_size > _MAX_FILE_BYTES and not relative.startswith(".git/"):
                return f"{relative} is too large to compare"
        vk.remove_output(os.path.join(self.git_dir, "index"))
        self.git("read-tree", "HEAD")
        return self.git("status", "--porcelain", "--untracked-files=all", "--ignored", "--ignore-submodules=all",
                        worktree=True)  # fmt: skip

    def _copy(self, relative: str, *, directory: bool) -> None:
        source = os.path.join(self.agent_git_dir, relative)
        st = vk.lstat_output(source)
        if st is None:
            return
        target = os.path.join(self.git_dir, relative)
        if directory and stat.S_ISDIR(st.st_mode):
            os.makedirs(target, exist_ok=True)
            for entry, entry_st in sorted(vk.walk_output(source, max_entries=self._budget[1]).items()):
                if relative == "objects" and entry.split("/")[0] == "info":
                    continue  # alternates and the like: other repositories' objects
                self._copy_entry(os.path.join(source, entry), os.path.join(target, entry), entry_st)
        else:
            self._copy_entry(source, target, st)

    def _copy_entry(self, source: str, target: str, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(target, exist_ok=True)
            return
        if not stat.S_ISREG(st.st_mode):
            raise vk.Failure(f"{source} is not a regular file or directory")
        self._budget[0] -= st.st_size
        self._budget[1] -= 1
        if self._budget[0] < 0 or self._budget[1] < 0:
            raise vk.Failure(f"{self.agent_git_dir} is too large to inspect")
        data = vk.read_output(source, max_bytes=st.st_size)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
