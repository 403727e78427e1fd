"""``snapgym/Python-v0``: the action is Python source, run in one interpreter per episode.

Variables, imports and the working directory survive between the steps of an
episode and never between episodes (reset discards the interpreter with the
rest of the sandbox). A cell whose last statement is an expression shows its
``repr``, as in a notebook. Exceptions come back as a traceback on stderr with
exit code 1. A checkpoint keeps the files, not the interpreter's variables.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from envs.base import SandboxEnv
from pool.results import ExecResult

_SERVER_SOURCE = (Path(__file__).parent / "repl_server.py").read_bytes()
SERVER_PATH = "/run/.snapgym-repl.py"
SOCKET_PATH = "/run/.snapgym-repl.sock"
CELL_TIMED_OUT = 124
"""The client's exit code when a cell ran past its timeout (see repl_server)."""


class PythonEnv(SandboxEnv):
    """Actions are Python cells; observations are their output and status.

    See :class:`envs.base.SandboxEnv` for the arguments and the episode rules.
    """

    own_paths = frozenset({SERVER_PATH, SOCKET_PATH, f"{SOCKET_PATH}.pid"})
    state_in_files = False  # the interpreter's variables are in its process, which a checkpoint does not keep

    def _on_episode_start(self) -> None:
        assert self._sandbox is not None
        self._sandbox.write_file(SERVER_PATH, _SERVER_SOURCE, mode=0o644)

    def _run(self, action: str) -> ExecResult:
        assert self._sandbox is not None
        timeout = self._action_timeout_s()
        command = f"exec python3 -I -S {SERVER_PATH} run {SOCKET_PATH} {timeout}"
        result = self._sandbox.exec(
            command,
            stdin=action,
            timeout_s=timeout + 3.5,  # the client's own limit is timeout + 1 s (repl_server: its interrupt grace)
            cwd=self.task.workdir,
            env={**self._episode_env(), "SNAPGYM_WORKDIR": self.task.workdir},
            max_output_bytes=self.max_output_bytes,
        )
        if result.exit_code == CELL_TIMED_OUT and not result.timed_out:
            result = dataclasses.replace(result, timed_out=True)
        return result
