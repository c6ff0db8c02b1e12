import pytest

from speccap.serving.sessions import Limits, ServingError, SessionStore


class FakeClock:
    """Time under the test's control, so expiry is checked without sleeping."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _status(fn, *args):
    with pytest.raises(ServingError) as err:
        fn(*args)
    return err.value.status, err.value.message


def test_sessions_belong_to_their_client_and_are_capped():
    store = SessionStore(Limits(max_sessions_per_client=2, max_sessions=3))
    a1, a2 = store.open("a", object()), store.open("a", object())
    assert a1.id != a2.id and 0 < a1.id < 2**31
    status, msg = _status(store.open, "a", object())
    assert status == 429 and "'a' already holds 2" in msg
    b = store.open("b", object())  # another client is not affected by a's cap
    assert store.get("b", b.id) is b
    assert _status(store.open, "c", object())[0] == 503  # the server-wide cap
    # a's session is unknown to b (not "forbidden": ids are not confirmed to strangers)
    assert _status(store.get, "b", a1.id)[0] == 404
    store.close("a", a1.id)
    assert _status(store.get, "a", a1.id)[0] == 404
    assert store.count("a") == 1 and len(store) == 2


def test_idle_sessions_expire_but_never_mid_request():
    clock = FakeClock()
    store = SessionStore(Limits(idle_seconds=10), clock=clock)
    idle, busy, fresh = (store.open("a", object()) for _ in range(3))
    clock.t += 8
    store.get("a", fresh.id)  # use refreshes the clock
    clock.t += 5
    busy.lock.acquire()
    assert store.expire() == [idle.id]
    assert store.expired_total == 1 and len(store) == 2
    busy.lock.release()
    assert store.expire() == [busy.id]
    clock.t += 11
    assert store.expire() == [fresh.id] and len(store) == 0


def test_verify_order_and_sizes():
    store = SessionStore(Limits(max_block=4, max_sync=8))
    s = store.open("a", object())
    store.check_verify(s, s.id, 1, 0, 4)
    s.last_seq = 1
    assert _status(store.check_verify, s, s.id, 1, 0, 2) == (409, f"replayed packet: seq 1 of session {s.id} was "
                                                                  "already verified (next is 2)")
    assert "out-of-order" in _status(store.check_verify, s, s.id, 3, 0, 2)[1]
    assert _status(store.check_verify, s, s.id + 1, 2, 0, 2)[0] == 400  # packet names another session
    assert "longer than the limit 4" in _status(store.check_verify, s, s.id, 2, 0, 5)[1]
    assert _status(store.check_verify, s, s.id, 2, 9, 1)[0] == 422
    assert _status(store.check_verify, s, s.id, 2, 0, 0)[0] == 422


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_block"):
        Limits(max_block=0)
    with pytest.raises(ValueError, match="idle_seconds"):
        Limits(idle_seconds=0)
