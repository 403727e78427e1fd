"""The boundary at the end of an agent's turn: what a backend does before the verifier runs.

- :mod:`~pool.verification.plan`: the three modes (``strict``, ``toolchain``, ``shared``), the
  :class:`VerificationPlan` a backend is handed and the :class:`VerificationReport` it returns,
  and the link rules every backend applies to the outputs (:func:`leads_into`).
- :mod:`~pool.verification.installs`: which of the paths an agent added a ``toolchain``
  verifier gets, rule by rule (:class:`InstallDelta` records what was grafted and dropped).
"""

from pool.verification.installs import InstallDelta
from pool.verification.plan import (
    MAX_LINK_HOPS,
    REWARD_DIR,
    SHARED_HOOKS,
    SHARED_SKELETONS,
    TESTS_PATH,
    VerificationPlan,
    VerificationReport,
    VerifyMode,
    leads_into,
    outermost,
    protected_tops,
)

__all__ = [
    "MAX_LINK_HOPS",
    "REWARD_DIR",
    "SHARED_HOOKS",
    "SHARED_SKELETONS",
    "TESTS_PATH",
    "InstallDelta",
    "VerificationPlan",
    "VerificationReport",
    "VerifyMode",
    "leads_into",
    "outermost",
    "protected_tops",
]
