"""The verifier refuses what it must, with the right status, and stays healthy for everyone else."""

import socket
import time

import httpx
import pytest

from speccap.decoding import packets
from speccap.serving.client import CloudRefused, CloudUnavailable
from speccap.serving.edge import caption_remote
from speccap.serving.sessions import Limits
from speccap.serving.tokens import load_tokens

from .conftest import TOKEN, link, settings

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _open(http, mel, **kw):
    r = http.post("/v1/sessions", content=packets.open_packet(mel, "en", "greedy", **kw), headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["session"]


def _healthy(client, edge, mel):
    """The server answers and still verifies a whole caption."""
    assert client.health()["status"] == "ok"
    rec = caption_remote(edge, client, client.info(), mel, "en", settings(), link())
    assert rec.network["fallback"] == 0 and rec.rounds > 0


def test_every_endpoint_needs_the_token(pair, clips, serve, client_for):
    srv = serve()
    mel = clips[0][1]
    with httpx.Client(base_url=srv.url) as http:
        sid = _open(http, mel)
        calls = [("GET", "/v1/info", None), ("GET", "/v1/health", None),
                 ("POST", "/v1/sessions", packets.open_packet(mel, "en", "greedy")),
                 ("POST", f"/v1/sessions/{sid}/verify", packets.verify_packet(sid, 1, [], [3, 4], 7)),
                 ("DELETE", f"/v1/sessions/{sid}", None)]
        for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}):
            for method, path, body in calls:
                r = http.request(method, path, content=body, headers=headers)
                assert r.status_code == 401, (headers, path)
                assert r.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in r.text
        # the refused calls changed nothing: the session is still there at seq 0
        r = http.post(f"/v1/sessions/{sid}/verify", content=packets.verify_packet(sid, 1, [], [3, 4], 7), headers=AUTH)
        assert r.status_code == 200
    with pytest.raises(CloudRefused, match="401"):
        client_for(srv, token="another-token-1234567").info()


def test_bad_input_is_refused_with_the_right_status(pair, clips, serve, client_for):
    edge, cloud = pair
    srv = serve(Limits(max_block=6, max_payload_bytes=200_000))
    mel = clips[0][1]
    vocab = cloud.vocab_size
    bits = packets.id_bits(vocab)
    with httpx.Client(base_url=srv.url, headers=AUTH) as http:
        sid = _open(http, mel)

        def verify(body, session=sid):
            return http.post(f"/v1/sessions/{session}/verify", content=body)
        cases = {
            "garbage bytes": (verify(b"\x00garbage" * 7), 400, "malformed VERIFY"),
            "empty body": (verify(b""), 400, "shorter than"),
            "garbage open": (http.post("/v1/sessions", content=b"hello"), 400, "malformed OPEN"),
            "wrong kind": (verify(packets.verdict_packet(sid, 1, 0, 3, bits)), 400, "expected a VERIFY"),
            "wrong version": (verify(b"SC\x07" + packets.verify_packet(sid, 1, [], [3], bits)[3:]), 400, "version 7"),
            "oversized": (verify(b"\x00" * 300_000), 413, "over the limit"),
            "unknown session": (verify(packets.verify_packet(12345, 1, [], [3], bits), 12345), 404, "no open session"),
            "block too long": (verify(packets.verify_packet(sid, 1, [], [3] * 7, bits)), 422, "longer than the limit 6"),
            "no draft": (verify(packets.verify_packet(sid, 1, [5], [], bits)), 422, "at least one draft token"),
            "id out of range": (verify(packets.verify_packet(sid, 1, [], [vocab + 1], bits + 1)), 422, "vocabulary"),
            "session mismatch": (verify(packets.verify_packet(sid + 1, 1, [], [3], bits)), 400, "names session"),
            "out of order": (verify(packets.verify_packet(sid, 2, [], [3], bits)), 409, "out-of-order"),
            "trailing bytes": (verify(packets.verify_packet(sid, 1, [], [3], bits) + b"xx"), 400, "unexpected bytes"),
            "wrong mel bands": (http.post("/v1/sessions", content=packets.open_packet(mel[:80], "en", "greedy")), 422,
                                "mel bands"),
            "non-numeric id": (http.post("/v1/sessions/abc/verify", content=b"x"), 422, ""),
        }
        for name, (r, status, text) in cases.items():
            assert r.status_code == status, (name, r.status_code, r.text)
            assert text in r.text, (name, r.text)
        # none of it touched the session: seq 1 is still next, and a replay of it is refused
        ok = packets.verify_packet(sid, 1, [], [3, 4], bits)
        assert verify(ok).status_code == 200
        r = verify(ok)
        assert r.status_code == 409 and "replayed" in r.json()["error"]
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204
        assert http.delete(f"/v1/sessions/{sid}").status_code == 404
    _healthy(client_for(srv), edge, mel)


def test_clients_cannot_touch_each_others_sessions_and_are_capped(pair, clips, serve):
    other = "second-client-token-abcdef"
    srv = serve(Limits(max_sessions_per_client=2), tokens={TOKEN: "alice", other: "bob"})
    mel = clips[0][1]
    with httpx.Client(base_url=srv.url, headers=AUTH) as alice, \
            httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {other}"}) as bob:
        a = [_open(alice, mel) for _ in range(2)]
        r = alice.post("/v1/sessions", content=packets.open_packet(mel, "en", "greedy"))
        assert r.status_code == 429 and "'alice' already holds 2" in r.text
        bob_sid = bob.post("/v1/sessions", content=packets.open_packet(mel, "en", "greedy")).json()["session"]
        r = bob.post(f"/v1/sessions/{a[0]}/verify", content=packets.verify_packet(a[0], 1, [], [3], 7))
        assert r.status_code == 404
        assert bob.delete(f"/v1/sessions/{a[0]}").status_code == 404
        assert alice.delete(f"/v1/sessions/{a[0]}").status_code == 204
        assert alice.post("/v1/sessions", content=packets.open_packet(mel, "en", "greedy")).status_code == 201
        assert bob.delete(f"/v1/sessions/{bob_sid}").status_code == 204


def test_vanished_clients_sessions_expire_and_free_memory(pair, clips, serve, client_for):
    edge, _ = pair
    srv = serve(Limits(idle_seconds=0.4), reap_every=0.05)
    client = client_for(srv)
    mel = clips[0][1]
    with httpx.Client(base_url=srv.url, headers=AUTH) as http:
        sids = [_open(http, mel) for _ in range(3)]
        http.post(f"/v1/sessions/{sids[0]}/verify", content=packets.verify_packet(sids[0], 1, [], [3, 4], 7))
    # a client that dies mid-request: half a request on a raw socket, then gone
    raw = socket.create_connection((srv.host, srv.port))
    raw.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                + b"\r\nContent-Length: 100000\r\n\r\nSC\x01")
    raw.close()
    store = srv.server.config.app.state.store
    assert len(store) == 3
    deadline = time.monotonic() + 5
    while len(store) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(store) == 0 and store.expired_total == 3
    _healthy(client, edge, mel)


def test_token_file_and_environment(tmp_path, monkeypatch):
    f = tmp_path / "tokens"
    f.write_text("# edge devices\nalice:" + "a" * 20 + "\n" + "b" * 20 + "  # unnamed\n\n")
    assert load_tokens(f) == {"a" * 20: "alice", "b" * 20: "client2"}
    monkeypatch.setenv("SPECCAP_TOKEN", "c" * 20)
    assert load_tokens() == {"c" * 20: "default"}
    monkeypatch.setenv("SPECCAP_TOKEN", "short")
    with pytest.raises(ValueError, match="at least 16 characters"):
        load_tokens()
    monkeypatch.delenv("SPECCAP_TOKEN")
    with pytest.raises(ValueError, match="no bearer token"):
        load_tokens()
    with pytest.raises(FileNotFoundError, match="missing"):
        load_tokens(tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no token"):
        load_tokens(tmp_path / "empty")


def test_unreachable_server_is_a_clear_error(client_for):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(CloudUnavailable, match="gave up after 2 attempts"):
        client_for(f"http://127.0.0.1:{port}", retries=1, backoff=0.01).info()
    with pytest.raises(ValueError, match="http:// or https://"):
        client_for("127.0.0.1:8765")
