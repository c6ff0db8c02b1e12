"""Many edge clients against one verifier: the load run behind the CI test and benchmarks/serving.py.

Each client is a thread with its own HTTP connection, captioning its share of the clips one after
the other with the networked loop; the edge model is shared (inference only). Nothing is lost
silently: a caption that raised is an error with its client and index, and every caption that
finished is kept with its tokens, so a caller can compare them with the in-process loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..decoding.link import Link
from ..models.base import AudioLM
from .client import VerifierClient
from .edge import caption_remote


@dataclass
class Caption:
    client: int
    index: int
    job: int  # which clip
    token_ids: list[int]
    seconds: float  # wall time of the caption
    rounds: int
    verified: int  # draft tokens the server verified
    fallback: int
    verify_rtts: list[float] = field(default_factory=list)


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def run_load(edge: AudioLM, url: str, token: str, jobs: list[tuple[np.ndarray, str]], make_settings, link_config,
             clients: int = 16, per_client: int = 20, wire_dtype: str = "float32", timeout: float = 30.0,
             cafile: str | None = None, progress=None) -> tuple[dict, list[Caption], list[str]]:
    """Run `clients` x `per_client` captions; returns (summary, captions, errors). `make_settings()`
    gives fresh SpecSettings per caption (policies keep state). `progress(n)`, if given, is called
    after each caption."""
    captions: list[Caption] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    info = VerifierClient(url, token, timeout, cafile=cafile).info()

    def client_thread(c: int):
        with VerifierClient(url, token, timeout, cafile=cafile) as client:
            start.wait()
            for i in range(per_client):
                j = (c * per_client + i) % len(jobs)
                features, language = jobs[j]
                t = time.perf_counter()
                try:
                    rec = caption_remote(edge, client, info, features, language, make_settings(),
                                         Link(link_config, seed=c * per_client + i), wire_dtype, wire_dtype)
                except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                    with lock:
                        errors.append(f"client {c} caption {i}: {type(exc).__name__}: {exc}")
                    continue
                cap = Caption(c, i, j, rec.token_ids, time.perf_counter() - t, rec.rounds, rec.transmitted,
                              rec.network["fallback"], rec.network["verify_rtts"])
                with lock:
                    captions.append(cap)
                if progress is not None:
                    progress(1)

    threads = [threading.Thread(target=client_thread, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rtts = [r for c in captions for r in c.verify_rtts]
    verified = sum(c.verified for c in captions)
    summary = {
        "clients": clients, "per_client": per_client, "captions": len(captions),
        "lost": clients * per_client - len(captions), "errors": len(errors),
        "fallback_blocks": sum(c.fallback for c in captions), "wall_s": wall,
        "captions_per_s": len(captions) / wall if wall else 0.0,
        "verified_tokens_per_s": verified / wall if wall else 0.0, "verify_requests": len(rtts),
        "verify_p50_ms": 1000 * _pct(rtts, 50), "verify_p99_ms": 1000 * _pct(rtts, 99),
        "caption_p50_s": _pct([c.seconds for c in captions], 50),
        "caption_p99_s": _pct([c.seconds for c in captions], 99),
    }
    return summary, captions, errors
