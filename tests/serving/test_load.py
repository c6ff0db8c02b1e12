"""16 edge clients at once against one verifier on loopback: no errors, nothing lost, and every
caption the one the in-process loop gives for its clip (benchmarks/serving.py measures 16 x 20)."""

import pytest

from speccap.config import LinkConfig
from speccap.decoding.engine import speculative
from speccap.serving.load import run_load

from .conftest import TOKEN, link, settings


@pytest.mark.e2e
def test_sixteen_clients_at_once(pair, clips, serve, client_for):
    edge, cloud = pair
    srv = serve()
    jobs = [(mel, "en") for _, mel in clips]
    expected = [speculative(edge, cloud, mel, "en", settings(), link()).token_ids for mel, _ in jobs]
    summary, captions, errors = run_load(edge, srv.url, TOKEN, jobs, settings, LinkConfig(), clients=16,
                                         per_client=4)
    assert errors == [] and summary["lost"] == 0 and summary["captions"] == 64
    assert summary["fallback_blocks"] == 0
    assert sorted((c.client, c.index) for c in captions) == [(c, i) for c in range(16) for i in range(4)]
    assert all(c.token_ids == expected[c.job] for c in captions)
    assert summary["verify_requests"] == sum(c.rounds for c in captions) > 64
    assert 0 < summary["verify_p50_ms"] <= summary["verify_p99_ms"]
    health = srv.server.config.app.state.stats
    assert health["verified_rounds"] == summary["verify_requests"] and health["failed"] == 0
    assert len(srv.server.config.app.state.store) == 0  # every session closed
    spent = client_for(srv).health()["model_seconds"]  # the server's own account of its model's time
    assert spent["prefill"] > 0 and spent["forward"] > 0


@pytest.mark.e2e
def test_a_batching_server_verifies_concurrent_sessions_together_with_the_same_captions(pair, clips, serve,
                                                                                        client_for):
    """`--batch`: the verify requests of concurrent sessions share forwards (gathered over a window),
    and every caption is still the in-process loop's, for a greedy, a rank and a sampling rule."""
    edge, cloud = pair
    srv = serve(batch=8, batch_window_ms=20.0)
    jobs = [(mel, "en") for _, mel in clips]
    for case in (dict(), dict(rule="rank", rank=2), dict(rule="spec_sampling", temperature=1.0, seed=3)):
        def make(case=case):
            return settings(**case)
        expected = [speculative(edge, cloud, mel, "en", make(), link()).token_ids for mel, _ in jobs]
        summary, captions, errors = run_load(edge, srv.url, TOKEN, jobs, make, LinkConfig(), clients=6, per_client=4)
        assert errors == [] and summary["lost"] == 0 and summary["fallback_blocks"] == 0
        assert all(c.token_ids == expected[c.job] for c in captions)
    gather = srv.server.config.app.state.gather
    assert gather.calls > gather.forwards > 0  # some forwards served more than one session
    health = client_for(srv).health()
    assert health["gathered_calls"] == gather.calls and health["failed"] == 0
    assert health["model_seconds"] == {"prefill": sum(p.seconds["prefill"] for p in gather.pools),
                                       "forward": sum(p.seconds["run"] for p in gather.pools)}
    assert health["model_seconds"]["forward"] > 0
    assert len(srv.server.config.app.state.store) == 0
    assert not any(p.cache.lengths.any() for p in gather.pools)  # every closed session freed its row
