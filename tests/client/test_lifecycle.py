"""The client's lifecycle: one phase, checked transitions, a failure kept and raised as copies."""

import threading

import pytest

from bosen.client.lifecycle import Lifecycle, Phase
from bosen.errors import BosenError, ClientClosed, ServerLost


def test_a_clean_life_goes_through_every_phase_and_workers_see_closed_from_closing_on():
    life = Lifecycle()
    life.check()  # STARTING: nothing to raise yet
    for phase in (Phase.RUNNING, Phase.CLOSING, Phase.LEAVING, Phase.CLOSED):
        life.to(phase)
        assert life.phase is phase
        if phase is Phase.RUNNING:
            assert life.running
            life.check()
        else:
            assert not life.running
            with pytest.raises(ClientClosed):
                life.check()
    assert life.leaving and not life.failed


@pytest.mark.parametrize("start, bad", [(Phase.RUNNING, Phase.STARTING), (Phase.CLOSED, Phase.RUNNING),
                                        (Phase.LEAVING, Phase.CLOSING)])
def test_a_transition_the_diagram_does_not_allow_raises(start, bad):
    life = Lifecycle()
    path = {Phase.RUNNING: [Phase.RUNNING], Phase.CLOSED: [Phase.CLOSED],
            Phase.LEAVING: [Phase.RUNNING, Phase.CLOSING, Phase.LEAVING]}[start]
    for p in path:
        life.to(p)
    with pytest.raises(RuntimeError, match=f"{start.value} -> {bad.value}"):
        life.to(bad)


def test_the_first_failure_is_kept_and_every_thread_raises_its_own_copy():
    life = Lifecycle()
    life.to(Phase.RUNNING)
    first = ServerLost("server 1 (127.0.0.1:1) was lost")
    assert life.fail(first)
    assert not life.fail(BosenError("a later one"))  # the first is the one to see
    assert life.phase is Phase.FAILED and life.error is first
    seen = []

    def worker():
        try:
            life.check()
        except BosenError as e:
            seen.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 3 and len({id(e) for e in seen}) == 3
    assert all(type(e) is ServerLost and e.__cause__ is first for e in seen)
    life.to(Phase.CLOSED)  # closing a failed client: workers now see it closed, the failure stays
    with pytest.raises(ClientClosed):
        life.check()
    with pytest.raises(ServerLost):
        life.raise_failure()
    assert not life.fail(BosenError("after close"))


def test_a_failure_while_closing_wins_over_closed_until_the_client_stopped():
    life = Lifecycle()
    life.to(Phase.RUNNING)
    life.to(Phase.CLOSING)
    assert life.fail(BosenError("rejected"))
    with pytest.raises(BosenError, match="rejected"):
        life.check()
