import socket
import subprocess

import numpy as np
import pytest

from speccap.config import LinkConfig
from speccap.data.features import log_mel
from speccap.decoding.engine import SpecSettings
from speccap.decoding.gates import make_gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed, UGSDAdaptive
from speccap.decoding.rules import make_rule
from speccap.serving.client import VerifierClient
from speccap.serving.client import wait_until_up as client_wait
from speccap.serving.server import BackgroundServer, create_app
from speccap.serving.sessions import Limits

from ..models.conftest import tiny_lm

TOKEN = "test-token-0123456789abcdef"
MAX = 16


@pytest.fixture(scope="package")
def pair():
    # two models of the real class sharing a tokenizer: edge and cloud disagree often
    return tiny_lm("qwen2_5_omni", seed=1), tiny_lm("qwen2_5_omni", seed=2)


def _wave(f0: float, seconds: float = 1.5, sr: int = 16000) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    return (0.3 * np.sin(2 * np.pi * f0 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)


@pytest.fixture(scope="package")
def clips():
    """(waveform, log-mel) of a few synthetic voiced clips."""
    return [(w, log_mel(w, hop_length=320)) for w in (_wave(f) for f in (140.0, 180.0, 230.0, 300.0))]


def settings(gate="always", rule="greedy", policy=None, **kw) -> SpecSettings:
    level, verify = kw.pop("level", "block"), kw.pop("verify", "alone")
    return SpecSettings(gate=make_gate(gate, kw.pop("threshold", None), level, verify),
                        rule=make_rule(rule, kw.pop("rank", 3), kw.get("temperature") or 1.0),
                        policy=policy or Fixed(3), max_new_tokens=kw.pop("max_new_tokens", MAX), **kw)


def link(**kw) -> Link:
    return Link(LinkConfig(**kw))


@pytest.fixture
def serve(pair):
    """Start verifier servers for the cloud model on loopback; all stopped at the end of the test."""
    started = []

    def start(limits=Limits(), tokens=None, lm=None, **kw):
        srv = BackgroundServer(create_app(lm or pair[1], tokens or {TOKEN: "tester"}, limits, **kw)).__enter__()
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.__exit__(None, None, None)


@pytest.fixture
def client_for():
    made = []

    def make(srv_or_url, token=TOKEN, **kw):
        url = srv_or_url if isinstance(srv_or_url, str) else srv_or_url.url
        c = VerifierClient(url, token, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(proc: subprocess.Popen, url: str, token: str = TOKEN, seconds: float = 90) -> None:
    """Wait for a verifier subprocess; an error (and no orphan) when it dies or stalls."""
    try:
        client_wait(url, token, seconds, alive=lambda: proc.poll() is None)
    except RuntimeError:
        proc.kill()
        raise


__all__ = ["TOKEN", "MAX", "settings", "link", "Fixed", "UGSDAdaptive"]
