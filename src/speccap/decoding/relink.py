"""Put a decoded caption's packets on another channel's clock, without decoding it again.

In the blocking loop the link never changes what is decoded under the greedy and rank rules: the
edge drafts, the cloud verifies, and only the virtual clock waits for the packets. So a caption
decoded on one channel holds every other channel's result too: the same tokens and bytes, the same
measured compute, and link time that is the other channel's model applied to the same packets in
the same order. The wisv evaluation decodes such configurations on one channel and relinks them
onto the others (about half its decodes). WISV itself reads the channel (its head sees the CSI and
`auto` picks the upload protocol from the link), and the pipelined loop overlaps packets with
compute; neither is relinked.

A record that can be relinked carries `link_log`: per packet, in order, its direction, size,
whether it was a streamed token (only its serialization beyond the propagation is charged), the
seconds it was charged and the virtual time after it.
"""

from __future__ import annotations

from .ledger import output_timing
from .link import Link


def link_log(packets: list[dict]) -> dict:
    """The compact per-packet log of a blocking-loop record (CaptionRecord.packets, all booked by
    ledger.Ledger.send)."""
    if any("charged" not in p for p in packets):
        raise ValueError("a packet was sent off the blocking clock (the pipelined loop): its caption "
                         "cannot be relinked")
    return {"dir": "".join(p["dir"][0] for p in packets), "bytes": [p["bytes"] for p in packets],
            "overlap": [int(p["overlap"]) for p in packets], "charged": [p["charged"] for p in packets],
            "at": [p["at"] for p in packets]}


def relink(record: dict, link: Link) -> dict:
    """The record as it would have been on `link`: the same packets sent in the same order (so a
    Markov channel or a lossy one draws the same random stream a live decode would), their new
    seconds in place of the old on the total, the link time and the time to first token."""
    log = record.get("link_log")
    if log is None:
        raise ValueError(f"caption {record.get('id', '?')}: no link_log (decoded by a loop or rule that reads "
                         "the channel, or by an older version): it cannot be relinked")
    ttft, shift, shift_ttft = record["ttft"], 0.0, 0.0
    before = link.retransmissions
    charged, at = [], []
    for d, nbytes, overlap, old, t in zip(log["dir"], log["bytes"], log["overlap"], log["charged"], log["at"]):
        seconds = link.transfer(nbytes, "up" if d == "u" else "down")
        new = max(seconds - link.rtt_s / 2, 0.0) if overlap else seconds
        shift += new - old
        if t <= ttft:  # sent before the first token was known: it moves the TTFT too
            shift_ttft = shift
        charged.append(new)
        at.append(t + shift)
    out = dict(record)
    out["link_log"] = dict(log, charged=charged, at=at)
    out["total_time"] = record["total_time"] + shift
    out["link_time"] = sum(charged)
    out["ttft"] = ttft + shift_ttft
    out["retransmissions"] = link.retransmissions - before
    out["oet"], out["otps"] = output_timing(out["total_time"], out["ttft"], record["tokens"])
    return out
