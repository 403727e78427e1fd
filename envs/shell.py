"""``snapgym/Shell-v0``: the action is a shell command, run with bash in the sandbox.

Each command runs in a fresh ``bash``, but the working directory and exported
variables carry over to the next step of the same episode, as in a terminal:
``cd src`` then ``ls`` lists ``src``. Unexported variables, functions and
aliases do not carry over. Nothing carries over between episodes: reset
discards the whole sandbox state. On a base without bash (a minimal root
filesystem), actions run in ``sh`` and nothing carries over between steps.
"""

from __future__ import annotations

import shlex

from envs.base import SandboxEnv
from pool.results import ExecResult

STATE_FILE = "/run/.snapgym-shell-state"
# Builtins only (no fork besides the action itself): the state file is a script
# that cds and re-exports, written after every action.
_WRAPPER = f"""\
[ -f {STATE_FILE} ] && . {STATE_FILE} 2>/dev/null
IFS= read -r -d '' __snapgym_action
eval "$__snapgym_action" </dev/null
__snapgym_rc=$?
{{ printf 'cd %q\\n' "$PWD"; export -p; }} > {STATE_FILE}
exit $__snapgym_rc
"""
# Without bash (a minimal root filesystem), the action runs in plain sh, statelessly.
_COMMAND = (
    f"command -v bash >/dev/null 2>&1 && exec bash --noprofile --norc -c {shlex.quote(_WRAPPER)}\n"
    '__snapgym_action=$(cat); eval "$__snapgym_action" </dev/null'
)


class ShellEnv(SandboxEnv):
    """Actions are bash commands; observations are their output and exit code.

    See :class:`envs.base.SandboxEnv` for the arguments and the episode rules.
    """

    own_paths = frozenset({STATE_FILE})

    def _run(self, action: str) -> ExecResult:
        assert self._sandbox is not None
        return self._sandbox.exec(
            _COMMAND,
            stdin=action,
            timeout_s=self._action_timeout_s(),
            env=self._episode_env() or None,
            max_output_bytes=self.max_output_bytes,
        )
