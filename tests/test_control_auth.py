"""A worker and its job driver prove the job secret to each other without sending it: what an
eavesdropper records cannot be turned into a driver that a worker trusts, and a worker never
unpickles a payload from a driver that could not prove the secret."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle
import hpack
from support.relay import Relay

from conftest import REPO, worker_env
from kolo._native import LaunchDriver
from kolo._rank_process import rank_code


class Recorder(Relay):
    """A relay that records every byte both ways."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.to_driver = bytearray()
        self.from_driver = bytearray()
        self.lock = threading.Lock()
        super().__init__(target, self._recorder(self.to_driver), self._recorder(self.from_driver))
        self.addr = f"127.0.0.1:{self.port}"

    def _recorder(self, log: bytearray):
        def record(data: bytes) -> None:
            with self.lock:
                log.extend(data)

        return record


def header_values(stream: bytes) -> list[bytes]:
    """Every header value in the HTTP/2 frames of one direction of a recorded connection (what
    an eavesdropper reads after HPACK decoding; bytes before the client preface are skipped)."""
    preface = stream.find(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    pos = preface + 24 if preface >= 0 else 0
    decoder, block, values = hpack.Decoder(), b"", []
    while pos + 9 <= len(stream):
        length = int.from_bytes(stream[pos : pos + 3], "big")
        kind, flags = stream[pos + 3], stream[pos + 4]
        payload = stream[pos + 9 : pos + 9 + length]
        pos += 9 + length
        if kind == 1:  # HEADERS: optional padding and priority fields
            pad = payload[0] if flags & 0x8 else 0
            payload = payload[(1 if flags & 0x8 else 0) + (5 if flags & 0x20 else 0) :]
            block = payload[: len(payload) - pad]
        elif kind == 9:  # CONTINUATION
            block += payload
        else:
            continue
        if flags & 0x4:  # END_HEADERS
            values += [value for _, value in decoder.decode(block, raw=True)]
            block = b""
    return values


class Crafted:
    """Unpickling this creates ``path``: the proof that a payload was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # type: ignore[override]
        return (open, (self.path, "w"))


def run_rank(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", rank_code("test")],
        cwd=REPO,
        env=worker_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_recorded_traffic_cannot_make_a_driver_the_worker_trusts(tmp_path: Path) -> None:
    # A real job whose one rank talks to its driver through a recording relay.
    job = LaunchDriver(1, start_timeout=30.0)
    job.put_payload(cloudpickle.dumps((sum, ([1, 2, 3],), {})))
    host, port = job.addr.rsplit(":", 1)
    relay = Recorder((host, int(port)))
    env = job.worker_env(0)
    secret = env["KOLO_JOB_SECRET"]
    done = run_rank({**env, "KOLO_DRIVER_ADDR": relay.addr})
    relay.close()
    assert done.returncode == 0, done.stderr
    assert cloudpickle.loads(job.result(0)) == 6
    job.shutdown()
    up, down = bytes(relay.to_driver), bytes(relay.from_driver)
    assert len(up) > 200 and len(down) > 200, "the relay recorded nothing"

    # The eavesdropper looks for the secret in what it recorded, raw and in the HTTP/2 headers.
    headers = header_values(up) + header_values(down)
    assert headers, "no HTTP/2 headers decoded from the recording"
    for recorded in (up, down, b"\n".join(headers)):
        assert secret.encode() not in recorded.lower()
        assert bytes.fromhex(secret) not in recorded
    candidates = {m.lower() for m in re.findall(rb"[0-9a-fA-F]{64}", b"\n".join(headers))}

    # With any candidate it starts a driver serving a crafted pickle; the job's rank, pointed
    # at it, must refuse before unpickling: the file never appears.
    marker = tmp_path / "unpickled"
    crafted = pickle.dumps(Crafted(marker))
    for candidate in candidates or {b"00" * 32}:
        impostor = LaunchDriver(
            1, start_timeout=10.0, secret=candidate.decode(), job_id=env["KOLO_JOB_ID"]
        )
        impostor.put_payload(crafted)
        refused = run_rank({**impostor.worker_env(0), "KOLO_JOB_SECRET": secret})
        impostor.shutdown()
        assert not marker.exists(), "the rank unpickled a payload from an impostor driver"
        assert refused.returncode != 0
        assert "could not prove it knows this job's secret" in refused.stderr, refused.stderr
