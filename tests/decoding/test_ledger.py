"""The ledger: the only writer of a caption's record and clock, and what its events book."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from speccap.config import LinkConfig
from speccap.decoding.cost import CostModel, Work
from speccap.decoding.ledger import CaptionRecord, Ledger, output_timing
from speccap.decoding.link import Link
from speccap.decoding.relink import link_log, relink
from speccap.decoding.stats import greedy_stats
from speccap.decoding.verify import Verdict
from speccap.metrics.system import ResourceMonitor

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "speccap"
LEDGER = PACKAGE / "decoding" / "ledger.py"
FIELDS = {f.name for f in dataclasses.fields(CaptionRecord)} | {"sessions"}
MUTATORS = {"append", "extend", "update", "insert", "pop", "clear", "setdefault", "remove", "__setitem__"}
# attributes of other objects that share a record field's name: each object's own counter
OWN = {("decoding/link.py", "self.retransmissions"),  # the link's lost packets, over every caption it carries
       ("decoding/qs.py", "self.accepted"),  # adaptive Q-S: accepted tokens per lattice level
       ("serving/verifier.py", "session.rounds")}  # a served session's rounds, for /health
COST = CostModel({r: {"prefill": [1e-3, 1e-5], "extend": [2e-4, 5e-5, 1e-7]} for r in ("edge", "cloud")})


def record_writes(source: str, name: str) -> list[str]:
    """Where `source` assigns a record field (directly, through an alias, or by a mutating call),
    moves a clock's virtual time, builds a clock or runs a model call on one."""
    tree = ast.parse(source)
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Attribute) and node.value.attr in FIELDS
               for t in node.targets if isinstance(t, ast.Name)}

    def holds_field(e) -> bool:
        if (name, ast.unparse(e)) in OWN:
            return False
        return (isinstance(e, ast.Attribute) and e.attr in FIELDS) or (isinstance(e, ast.Name) and e.id in aliases)

    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and (t.attr == "virtual" or holds_field(t)):
                found.append(f"{name}:{node.lineno} assigns {ast.unparse(t)}")
            if isinstance(t, ast.Subscript) and holds_field(t.value):
                found.append(f"{name}:{node.lineno} assigns {ast.unparse(t)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr in MUTATORS and holds_field(f.value):
                found.append(f"{name}:{node.lineno} calls {ast.unparse(f)}")
            if f.attr in ("run", "measure") and isinstance(f.value, ast.Attribute) and f.value.attr == "clock":
                found.append(f"{name}:{node.lineno} calls {ast.unparse(f)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "Clock"):
            found.append(f"{name}:{node.lineno} calls {node.func.id}")
    return found


def test_no_module_but_the_ledger_writes_a_record_or_moves_a_clock():
    writes = [w for p in sorted(PACKAGE.rglob("*.py")) if p != LEDGER
              for w in record_writes(p.read_text(), str(p.relative_to(PACKAGE)))]
    assert writes == []


@pytest.mark.parametrize("snippet", [
    "rec.drafted += 1",
    "self.rec.ttft = clock.virtual",
    "books.rec.packets.append(p)",
    "net = rec.network\nnet['fallback'] += 1",
    "rec.network['requests'] += 1",
    "clock.virtual = 3.0",
    "out, dt = self.clock.run(fn, x)",
    "c = Clock(None)",
    "setattr(rec, 'bonus', 2)",
])
def test_the_scan_sees_every_way_of_writing_the_books(snippet):
    assert record_writes(snippet, "x.py")


def test_the_scan_leaves_other_objects_own_counters_alone():
    assert record_writes("self.retransmissions += 1\nself.cloud_holds = 3\nn = rec.drafted + 1", "decoding/link.py") \
        == []


LINK = LinkConfig(name="test", uplink_mbps=1.0, downlink_mbps=8.0, rtt_ms=20.0, overhead_bytes=40)


def test_send_books_bytes_time_and_the_relink_log():
    books = Ledger("speculative")
    link = Link(LINK)
    books.send(link, "up", "verify", b"x" * 85)
    books.send(link, "down", "token", b"y" * 10, overlap=True)
    rec = books.rec
    up = 0.010 + 8 * 125 / 1e6
    down = 0.010 + 8 * 50 / 8e6
    assert (rec.bytes_up, rec.bytes_down) == (85, 10)
    assert rec.packets[0]["charged"] == pytest.approx(up) and rec.packets[0]["at"] == pytest.approx(up)
    # a streamed token pays only its serialization beyond the propagation already paid
    assert rec.packets[1]["charged"] == pytest.approx(max(down - 0.010, 0.0))
    assert books.now == pytest.approx(rec.link_time) == pytest.approx(up + down - 0.010)
    assert link_log(rec.packets)["dir"] == "ud"


def test_account_books_bytes_off_the_clock():
    books = Ledger("pipelined", in_flight=2)
    seconds = books.account(Link(LINK), "up", "verify", b"z" * 60)
    assert seconds > 0 and books.now == 0.0 and books.rec.link_time == 0.0 and books.rec.bytes_up == 60
    books.overlapped_link_time()
    assert books.rec.link_time == seconds and books.rec.in_flight == 2
    with pytest.raises(ValueError, match="cannot be relinked"):
        link_log(books.rec.packets)


def test_a_verdict_books_accepted_positions_and_the_cloud_token():
    books = Ledger("speculative")
    books.escalated(4)
    books.verdict(Verdict(2, 7, True), 4)  # rejected at the third: three positions examined, a correction
    books.escalated(2)
    books.verdict(Verdict(2, 9, False), 2)  # all accepted: a bonus
    books.escalated(3, verified=False)  # stale: dropped unverified
    rec = books.rec
    assert (rec.rounds, rec.transmitted, rec.stale, rec.accepted, rec.corrected, rec.bonus) == (2, 9, 1, 4, 1, 1)
    assert rec.position_checked == [2, 2, 1] and rec.position_accepted == [2, 2, 0]


def test_the_first_token_is_kept_and_waiting_moves_the_clock_forward_only():
    books = Ledger("pipelined", in_flight=1)
    books.elapse(0.5)
    books.first_token()
    books.first_token(at=2.0)
    books.wait_until(0.2)  # already past: no wait
    books.wait_until(1.5)
    assert books.rec.ttft == 0.5 and books.now == 1.5 and books.rec.wait_time == pytest.approx(1.0)


class _Tokens:
    def decode(self, ids):
        return " ".join(map(str, ids))


def test_finish_closes_the_books_and_relinking_recomputes_oet_the_same_way():
    books = Ledger("speculative")
    books.send(Link(LINK), "up", "verify", b"a" * 100)
    books.first_token()
    books.elapse(1.0)
    with ResourceMonitor() as mon:
        pass
    rec = books.finish(_Tokens(), [5, 6, 7], mon, sessions=("edge", "cloud"))
    assert rec.caption == "5 6 7" and rec.total_time == books.now and rec.sessions == ("edge", "cloud")
    m = dict(rec.metrics(), link_log=link_log(rec.packets))
    assert (m["oet"], m["otps"]) == output_timing(rec.total_time, rec.ttft, 3) == (1.0, 2.0)
    slower = relink(m, Link(dataclasses.replace(LINK, uplink_mbps=0.1)))
    assert slower["ttft"] > m["ttft"] and slower["oet"] == pytest.approx(1.0) and slower["otps"] == pytest.approx(2.0)


def test_the_network_books_add_measured_exchanges():
    books = Ledger("networked", networked=True)
    ex = type("Ex", (), {"seconds": 0.3, "compute": 0.1, "queue": 0.05, "bytes_up": 500, "bytes_down": 40})()
    books.exchange(ex, verify=True)
    for reason in map(str, range(7)):
        books.fallback(reason)
    books.reopened()
    net = books.rec.network
    assert net["requests"] == 1 and net["verify_rtts"] == [0.3] and net["net_time"] == pytest.approx(0.15)
    assert books.rec.cloud_compute == 0.1 and books.now == 0.3 and books.rec.link_time == pytest.approx(0.2)
    assert net["fallback"] == 7 and net["fallback_reasons"] == ["0", "1", "2", "3", "4"] and net["reopened"] == 1


@pytest.mark.parametrize("cost", [None, COST], ids=["measured", "cost model"])
def test_a_greedy_run_is_booked_as_its_forwards_one_by_one(pair, audio, cost):
    """`forward_run`: one call for a run of forwards, booked forward by forward with what the caller
    books between them (`before`), so the record and the clock are those of the forwards called one
    at a time; with a cost model to the bit, measured within the clock's own seconds."""
    edge, _ = pair
    _, mel = audio
    link = Link(LinkConfig())

    def by_one():
        books = Ledger("edge", cost)
        sess = books.prefill("edge", edge.start, mel, "en", work=Work("edge", mel.shape[-1], prefill=True))
        tok = 5
        for i in range(6):
            books.send(link, "down", "token", bytes(3 + i))
            tok = books.forward("edge", sess.extend, [tok], False, greedy_stats,
                                work=Work("edge", 1, sess.length)).summary.token
        return books, sess

    def as_run():
        books = Ledger("edge", cost)
        sess = books.prefill("edge", edge.start, mel, "en", work=Work("edge", mel.shape[-1], prefill=True))
        run = books.forward_run("edge", sess, [5], greedy_stats, 6, -1,
                                before=lambda run, j: books.send(link, "down", "token", bytes(3 + j)))
        assert run.forwards == 6
        return books, sess

    (one, s1), (many, s2) = by_one(), as_run()
    assert s1.length == s2.length == 6
    a, b = one.rec, many.rec
    assert (a.edge_fed, a.bytes_down, [p["bytes"] for p in a.packets]) == (b.edge_fed, b.bytes_down, [p["bytes"] for p in b.packets])
    if cost is not None:
        assert (a.edge_compute, one.now, [p["at"] for p in a.packets]) == (b.edge_compute, many.now, [p["at"] for p in b.packets])
    else:  # each forward charged its share of the run's measured seconds, each packet after the forwards before it
        assert many.now == pytest.approx(b.edge_compute + b.link_time) and b.edge_compute > b.prefill_time
        assert [p["at"] for p in b.packets] == sorted(p["at"] for p in b.packets)
