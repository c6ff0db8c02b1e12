"""What leaves the device, byte for byte; and the same loop over TLS."""

import datetime
import socket
import threading

import numpy as np
import pytest
import soundfile as sf

from speccap.decoding.engine import speculative
from speccap.serving.client import CloudUnavailable
from speccap.serving.edge import caption_remote
from speccap.serving.server import BackgroundServer, create_app

from .conftest import TOKEN, link, settings


class Recorder:
    """A TCP proxy on loopback that forwards both ways and keeps every byte the client sent."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.sent = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(conn, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, False), daemon=True).start()

    def _pump(self, src, dst, record):
        try:
            while data := src.recv(65536):
                if record:
                    self.sent += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


def _windows(data: bytes, width: int, step: int) -> set[bytes]:
    return {data[i:i + width] for i in range(0, len(data) - width + 1, step)}


def _found(haystack: bytes, needles: set[bytes], width: int) -> int:
    return sum(haystack[i:i + width] in needles for i in range(len(haystack) - width + 1))


@pytest.mark.parametrize("wire_dtype", ["float16", "float32"])
def test_no_window_of_the_waveform_crosses_the_wire(pair, clips, serve, client_for, tmp_path, wire_dtype):
    edge, _ = pair
    wave, mel = clips[1]
    srv = serve()
    proxy = Recorder((srv.host, srv.port))
    try:
        client = client_for(f"http://127.0.0.1:{proxy.port}")
        rec = caption_remote(edge, client, client.info(), mel, "en", settings(), link(), wire_dtype, wire_dtype)
        client.close()
    finally:
        proxy.close()
    sent = bytes(proxy.sent)
    assert rec.rounds > 0 and len(sent) >= rec.network["http_bytes_up"] * 0.9
    # the recorder really sees the traffic: the features are there, in the wire dtype
    feats = np.ascontiguousarray(mel, dtype=wire_dtype).tobytes()
    assert _found(sent, _windows(feats, 32, 32), 32) > 100
    # ... and no 8-sample window of the waveform, in any encoding a file or buffer would hold
    path = tmp_path / "clip.wav"
    sf.write(path, wave, 16000, subtype="PCM_16")
    pcm16 = sf.read(path, dtype="int16")[0].tobytes()
    for data, size in ((wave.astype(np.float32).tobytes(), 4), (wave.astype(np.float16).tobytes(), 2),
                       (pcm16, 2), (wave.astype(np.float64).tobytes(), 8)):
        width = 8 * size
        assert _found(sent, _windows(data, width, size), width) == 0
    assert _found(sent, _windows(path.read_bytes()[44:], 16, 2), 16) == 0  # the WAV file's own bytes


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return str(certfile), str(keyfile)


def test_tls_when_a_certificate_is_given(pair, clips, client_for, tmp_path):
    edge, cloud = pair
    certfile, keyfile = _self_signed(tmp_path)
    with BackgroundServer(create_app(cloud, {TOKEN: "edge"}), certfile=certfile, keyfile=keyfile) as srv:
        assert srv.url.startswith("https://")
        proxy = Recorder((srv.host, srv.port))
        try:
            client = client_for(f"https://127.0.0.1:{proxy.port}", cafile=certfile)
            mel = clips[0][1]
            rec = caption_remote(edge, client, client.info(), mel, "en", settings(), link(), "float32", "float32")
            client.close()
        finally:
            proxy.close()
        assert rec.token_ids == speculative(edge, cloud, mel, "en", settings(), link()).token_ids
        assert TOKEN.encode() not in proxy.sent and b"/v1/sessions" not in proxy.sent  # encrypted on the wire
        with pytest.raises(CloudUnavailable, match="cannot connect"):  # a client that does not trust it
            client_for(srv, retries=0).info()
