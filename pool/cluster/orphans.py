"""Pool actors end themselves when their Ray node goes away.

A Ray worker is a child of its node's raylet. If the raylet dies, as when a
node is killed or a test session is torn down abruptly, a worker stuck in a
call might otherwise linger, holding sandboxes. Each pool actor therefore
watches its parent process and exits once it has been re-parented. The host's
sandbox daemon then sees its socket close and kills every sandbox it holds.
"""

from __future__ import annotations

import os
import threading
import time


def exit_when_orphaned(*, interval_s: float = 1.0) -> None:
    """Start a daemon thread that exits this process once its parent process changes."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="snapgym-orphan-watch", daemon=True).start()
