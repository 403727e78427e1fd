"""``snapgym/Shell-v0``: the action is a shell command, run with bash in the sandbox.

Where the backend keeps a persistent shell (``capabilities.shell_session``, the local
backend), every action of an episode goes to one bash, as lines typed into a terminal: the
working directory, variables and functions carry over from step to step. Elsewhere each
action runs in a fresh ``bash``, and the working directory and exported variables carry over
(``cd src`` then ``ls`` lists ``src``; unexported variables and functions do not). Either way
a step that times out ends its shell, and the next step's shell starts in the last working
directory with the last exported variables. Nothing carries over between episodes: reset
discards the whole sandbox state. On a base without bash (a minimal root filesystem),
actions run in ``sh`` and nothing carries over between steps.
"""

from __future__ import annotations

import shlex

from envs.base import SandboxEnv
from pool.contract import SHELL_STATE_FILE as STATE_FILE
from pool.errors import UnsupportedError
from pool.results import ExecResult

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
    _no_session = False
    """Set when the sandbox has no bash for a session: every later step uses the per-step wrapper."""

    async def _run_async(self, action: str) -> ExecResult | None:
        """:meth:`_run` waited for on the running event loop, where the sandbox offers ``shell_async``
        (the local backend's shell session; see envs.aio); None: there is no such path, use :meth:`_run`."""
        shell_async = getattr(self._sandbox, "shell_async", None)
        if shell_async is None or not self._capabilities.shell_session or self._no_session:
            return None
        try:
            result: ExecResult = await shell_async(
                action,
                timeout_s=self._action_timeout_s(),
                env=self._episode_env() or None,
                max_output_bytes=self.max_output_bytes,
            )
        except UnsupportedError:
            self._no_session = True
            return None
        return result

    def _run(self, action: str) -> ExecResult:
        assert self._sandbox is not None
        if self._capabilities.shell_session and not self._no_session:
            try:
                return self._sandbox.shell(
                    action,
                    timeout_s=self._action_timeout_s(),
                    env=self._episode_env() or None,
                    max_output_bytes=self.max_output_bytes,
                )
            except UnsupportedError:
                self._no_session = True
        return self._sandbox.exec(
            _COMMAND,
            stdin=action,
            timeout_s=self._action_timeout_s(),
            env=self._episode_env() or None,
            max_output_bytes=self.max_output_bytes,
        )
