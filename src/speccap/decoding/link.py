"""The link model: how long a packet of n bytes takes, up or down.

time = RTT/2 (propagation, once per direction) + 8 * (bytes + overhead) / rate, and on a lost
packet (probability = packet error rate) the sender waits one RTT for the timeout and sends it
again. A two-state Markov channel (good / bad) can replace the fixed rates: the state moves at
every packet with the given transition probabilities (the Q-S paper's example: 4 Mbps good,
350 kbps bad). The random stream is seeded, so a sweep is repeatable. Settings are the `link:`
section of params (config.LinkConfig: rates in Mbps, RTT in ms).
"""

from __future__ import annotations

import numpy as np

from ..config import LinkConfig, MarkovParams  # noqa: F401  (MarkovParams: re-exported for callers)


class Link:
    """Charges time for real packets. `tap`, if given, is called with every payload sent (tests
    use it to check what crosses the link)."""

    max_retries = 20

    def __init__(self, params: LinkConfig, seed: int = 0, tap=None):
        if params.uplink_mbps <= 0 or params.downlink_mbps <= 0 or params.rtt_ms < 0:
            raise ValueError(f"link {params.name!r}: rates must be > 0 and RTT >= 0")
        if not 0 <= params.packet_error_rate < 1:
            raise ValueError(f"link {params.name!r}: packet error rate must be in [0, 1)")
        self.p = params
        self.rtt_s = params.rtt_ms / 1000
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
            return 1e6 * (m.good_mbps if self.good else m.bad_mbps)
        return 1e6 * (self.p.uplink_mbps if direction == "up" else self.p.downlink_mbps)

    def rate_now(self, direction: str) -> float:
        """Bits per second a packet sent now would see (the Markov state is read, not advanced):
        what an adaptive policy knows of the channel, as measured by the device's modem."""
        if self.p.markov is not None:
            m = self.p.markov
            return 1e6 * (m.good_mbps if self.good else m.bad_mbps)
        return 1e6 * (self.p.uplink_mbps if direction == "up" else self.p.downlink_mbps)

    def send(self, payload: bytes, direction: str) -> float:
        """Seconds for one packet (wire-format bytes) to arrive."""
        if self.tap is not None:
            self.tap(direction, payload)
        return self.transfer(len(payload), direction)

    def transfer(self, nbytes: int, direction: str) -> float:
        """Seconds for a packet of `nbytes` to arrive: what `send` charges, from the size alone
        (decoding.relink replays a caption's packet sizes on another channel)."""
        rate = self._rate(direction)
        one = 8 * (nbytes + self.p.overhead_bytes) / rate
        seconds = self.rtt_s / 2 + one
        tries = 0
        while self.p.packet_error_rate > 0 and self.rng.random() < self.p.packet_error_rate:
            tries += 1
            if tries > self.max_retries:
                raise ConnectionError(f"link {self.p.name!r}: packet lost {tries} times in a row")
            seconds += self.rtt_s + one  # timeout, then send again
        self.retransmissions += tries
        return seconds

