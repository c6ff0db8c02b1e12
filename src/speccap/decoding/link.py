"""The link model: how long a packet of n bytes takes, up or down.

time = RTT/2 (propagation, once per direction) + 8 * (bytes + overhead) / rate, and on a lost
packet (probability = packet error rate) the sender waits one RTT for the timeout and sends it
again. A two-state Markov channel (good / bad) can replace the fixed rates: the state moves at
every packet with the given transition probabilities (the Q-S paper's example: 4 Mbps good,
350 kbps bad). The random stream is seeded, so a sweep is repeatable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MarkovChannel:
    good_bps: float = 4e6
    bad_bps: float = 350e3
    p_good_to_bad: float = 0.1
    p_bad_to_good: float = 0.3


@dataclass(frozen=True)
class LinkParams:
    name: str = "default"
    uplink_bps: float = 20e6
    downlink_bps: float = 100e6
    rtt_s: float = 0.05
    packet_error_rate: float = 0.0
    overhead_bytes: int = 40  # IPv4 + TCP headers per packet (the wire format's own header is in the packet)
    markov: MarkovChannel | None = None
    max_retries: int = 20


class Link:
    """Charges time for real packets. `tap`, if given, is called with every payload sent (tests
    use it to check what crosses the link)."""

    def __init__(self, params: LinkParams, seed: int = 0, tap=None):
        if params.uplink_bps <= 0 or params.downlink_bps <= 0 or params.rtt_s < 0:
            raise ValueError(f"link {params.name!r}: rates must be > 0 and RTT >= 0")
        if not 0 <= params.packet_error_rate < 1:
            raise ValueError(f"link {params.name!r}: packet error rate must be in [0, 1)")
        self.p = params
        self.rng = np.random.default_rng(seed)
        self.good = True
        self.retransmissions = 0
        self.tap = tap

    def _rate(self, direction: str) -> float:
        if self.p.markov is not None:
            m = self.p.markov
            flip = m.p_good_to_bad if self.good else m.p_bad_to_good
            if self.rng.random() < flip:
                self.good = not self.good
            return m.good_bps if self.good else m.bad_bps
        return self.p.uplink_bps if direction == "up" else self.p.downlink_bps

    def send(self, payload: bytes, direction: str) -> float:
        """Seconds for one packet (wire-format bytes) to arrive."""
        if self.tap is not None:
            self.tap(direction, payload)
        nbytes = len(payload)
        rate = self._rate(direction)
        one = 8 * (nbytes + self.p.overhead_bytes) / rate
        seconds = self.p.rtt_s / 2 + one
        tries = 0
        while self.p.packet_error_rate > 0 and self.rng.random() < self.p.packet_error_rate:
            tries += 1
            if tries > self.p.max_retries:
                raise ConnectionError(f"link {self.p.name!r}: packet lost {tries} times in a row")
            seconds += self.p.rtt_s + one  # timeout, then send again
        self.retransmissions += tries
        return seconds


def link_params(cfg) -> LinkParams:
    """LinkParams from the `link:` section of params (a config.LinkConfig)."""
    markov = None
    if cfg.markov is not None:
        m = cfg.markov
        markov = MarkovChannel(m.good_mbps * 1e6, m.bad_mbps * 1e6, m.p_good_to_bad, m.p_bad_to_good)
    return LinkParams(name=cfg.name, uplink_bps=cfg.uplink_mbps * 1e6, downlink_bps=cfg.downlink_mbps * 1e6,
                      rtt_s=cfg.rtt_ms / 1000, packet_error_rate=cfg.packet_error_rate,
                      overhead_bytes=cfg.overhead_bytes, markov=markov)
