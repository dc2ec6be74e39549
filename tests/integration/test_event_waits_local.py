"""Event waits in the test kit (``processor.testing.LocalEnvironment``): a user's test
sends events with ``env.client.signal`` and moves the clock past a wait's timeout."""

from __future__ import annotations

import uuid

from processor.testing import LocalEnvironment
from tests.apps.event_pipelines import EVENT_TIMEOUT_S, app
from tests.apps.support import wait_until


def _waiting(env: LocalEnvironment, run_id: str) -> bool:
    state = env.status(run_id)
    return state is not None and state.phase == "suspended"


def test_a_signal_by_run_and_by_key_and_a_timeout_in_the_test_kit() -> None:
    with LocalEnvironment(app, partitions=2) as env:
        poked = env.submit("poked", {"n": 1})
        order = {"order": f"o-{uuid.uuid4().hex[:6]}", "region": "eu"}
        paid = [env.submit("paid", order) for _ in range(2)]
        late = env.submit("paid", {"order": "o-late", "region": "eu"})
        for run_id in (poked, *paid, late):
            wait_until(lambda r=run_id: _waiting(env, r), 10, f"{run_id} waits")

        env.client.signal("poke", {"v": 1}, run_id=poked)
        assert env.wait(poked).output == {"poked": {"v": 1}}

        env.client.signal("payment_received", 5, key=order["order"], correlation={"region": "eu"})
        assert [env.wait(run_id).output for run_id in paid] == [{"shipped": 5}] * 2

        env.advance(EVENT_TIMEOUT_S)
        ended = env.wait(late)
        assert ended.status == "failed"
