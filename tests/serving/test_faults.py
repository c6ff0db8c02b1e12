"""The edge always produces a caption: a killed, restarted or slow verifier only costs quality."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speccap.decoding.engine import edge_only, speculative
from speccap.decoding.gates import Gate
from speccap.serving.edge import caption_remote
from speccap.serving.sessions import Limits

from .conftest import MAX, TOKEN, free_port, link, settings, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
SERVER = f"""
import sys
from tests.models.conftest import tiny_lm
from speccap.serving.server import serve
from speccap.serving.sessions import Limits
serve(tiny_lm("qwen2_5_omni", seed=2), {{{TOKEN!r}: "edge"}}, Limits(), port=int(sys.argv[1]))
"""


def _start_server(port: int) -> subprocess.Popen:
    """The verifier in its own process (so it can really be killed), on a fixed loopback port."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=os.environ | {"PYTHONPATH": str(ROOT)})
    wait_until_up(proc, f"http://127.0.0.1:{port}")
    return proc


class KillAt(Gate):
    """Escalates every block, and kills the server just before the n-th escalation."""

    name = "kill-at"

    def __init__(self, proc: subprocess.Popen, n: int):
        self.proc, self.n, self.calls = proc, n, 0

    def escalate(self, block) -> bool:
        self.calls += 1
        if self.calls == self.n:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        return True


@pytest.mark.e2e
def test_killed_server_mid_caption_then_restarted(pair, clips, client_for):
    edge, cloud = pair
    port = free_port()
    proc = _start_server(port)
    client = client_for(f"http://127.0.0.1:{port}", retries=1, backoff=0.05, timeout=5)
    info = client.info()
    try:
        mel = clips[1][1]
        s = dataclasses.replace(settings(), gate=KillAt(proc, 3))
        rec = caption_remote(edge, client, info, mel, "en", s, link())
        # two blocks verified, then the cloud is gone: the rest stays on the edge, flagged
        assert proc.poll() is not None
        assert rec.rounds == 2 and rec.network["fallback"] >= 1
        assert "cannot connect" in rec.network["fallback_reasons"][0]
        assert 0 < rec.n_tokens <= MAX and rec.caption
        # the next caption: the edge alone, every block flagged
        rec2 = caption_remote(edge, client, info, clips[2][1], "en", settings(), link())
        assert rec2.rounds == 0 and rec2.network["fallback"] >= 1
        assert rec2.token_ids == edge_only(edge, clips[2][1], "en", MAX).token_ids
        # restarted: new captions verify again, exactly as in-process
        proc = _start_server(port)
        rec3 = caption_remote(edge, client, info, clips[2][1], "en", settings(), link())
        assert rec3.network["fallback"] == 0
        assert rec3.token_ids == speculative(edge, cloud, clips[2][1], "en", settings(), link()).token_ids
    finally:
        proc.kill()
        proc.wait()


class SlowLM:
    """The real cloud model, with every forward after the prefill delayed (an overloaded cloud)."""

    def __init__(self, lm, delay: float):
        self.lm, self.delay = lm, delay

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def start(self, features, language):
        sess = self.lm.start(features, language)
        extend = sess.extend

        def slow(ids, *a, **kw):
            time.sleep(self.delay)
            return extend(ids, *a, **kw)
        sess.extend = slow
        return sess


def test_slow_cloud_times_out_into_edge_fallback(pair, clips, serve, client_for):
    edge, cloud = pair
    srv = serve(lm=SlowLM(cloud, 1.5), compute_slots=4)
    client = client_for(srv, timeout=0.3, retries=2)
    mel = clips[0][1]
    t = time.perf_counter()
    rec = caption_remote(edge, client, client.info(), mel, "en", settings(), link(), breaker=2)
    elapsed = time.perf_counter() - t
    # timed-out requests are not retried (the server may have run them): two blocks time out, the
    # breaker keeps the rest local, and the caption is the edge's own
    assert rec.network["fallback"] >= 2 and rec.rounds == 0
    assert "no answer" in rec.network["fallback_reasons"][0]
    assert rec.token_ids == edge_only(edge, mel, "en", MAX).token_ids
    assert elapsed < 3.0
    # the server went on: the abandoned sessions were closed by the edge, and it still answers
    time.sleep(1.6)
    assert client.health()["sessions"] == 0


def test_expired_session_is_reopened_mid_caption(pair, clips, serve, client_for):
    """A session that expired between two blocks (or a server restarted in between): the edge opens
    a fresh one, brings it up to date, and the caption is still the in-process caption."""
    edge, cloud = pair
    srv = serve(Limits(idle_seconds=0.2), reap_every=0.02)
    client = client_for(srv)

    class Pause(Gate):
        name = "pause"
        calls = 0

        def escalate(self, block):
            Pause.calls += 1
            if Pause.calls == 3:
                time.sleep(0.5)  # the session expires while the edge drafts
            return True
    s = dataclasses.replace(settings(), gate=Pause())
    rec = caption_remote(edge, client, client.info(), clips[3][1], "en", s, link())
    assert rec.network["reopened"] == 1 and rec.network["fallback"] == 0
    assert rec.token_ids == speculative(edge, cloud, clips[3][1], "en", settings(), link()).token_ids
