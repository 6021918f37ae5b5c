"""Fault injection for ferry.dcp's own tests: FERRY_DCP_TEST_DIE="<phase>:<rank>" makes that
rank SIGKILL itself when it reaches the phase, as a node lost part way through a save would.
Unset (always, outside tests/dcp), it does nothing."""

from __future__ import annotations

import os
import signal


def maybe_die(phase: str) -> None:
    spec = os.environ.get("FERRY_DCP_TEST_DIE")
    if not spec:
        return
    want_phase, _, want_rank = spec.partition(":")
    if want_phase == phase and want_rank == os.environ.get("RANK"):
        os.kill(os.getpid(), signal.SIGKILL)
