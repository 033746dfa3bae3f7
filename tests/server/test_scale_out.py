"""Scale out: two ``cadenza serve`` processes behind a real nginx on loopback (the configuration of docs/server.md
"Deployment"), sharing one voice store. Requests alternate between the replicas, a voice saved through one speaks
on the other with the same audio, streaming (HTTP chunks and the WebSocket) passes the balancer unbuffered, and a
replica that dies is routed around."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from websockets.sync.client import connect

from test_server_harness import CONSENT, speech_prompt

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).is_file()), None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx; "
                                                       ".ci/run installs it)")

# The load balancer of docs/server.md "Deployment", with test paths. Streaming needs proxy_buffering off; the
# WebSocket needs HTTP/1.1 and the Upgrade headers; voice uploads need a body limit at least the server's.
NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    upstream cadenza {{
        server 127.0.0.1:{a} max_fails=1 fail_timeout=30s;
        server 127.0.0.1:{b} max_fails=1 fail_timeout=30s;
    }}
    server {{
        listen 127.0.0.1:{lb};
        client_max_body_size 12m;
        location / {{
            proxy_pass http://cadenza;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_next_upstream error timeout http_503;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not become healthy in {timeout:.0f} s")


def requests_served(url: str) -> int:
    """Speech requests a replica answered, from its Prometheus counters."""
    total = 0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("cadenza_requests_total{") and 'endpoint="/v1/audio/speech"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scale_out")
    voices = tmp / "voices"
    ports = {"a": free_port(), "b": free_port(), "lb": free_port()}
    env = dict(os.environ, CADENZA_VOICES_DIR=str(voices))
    env.pop("CADENZA_VOICES_DB", None)
    replicas = {}
    for name in ("a", "b"):
        cmd = [sys.executable, "-m", "cadenza", "serve", "--port", str(ports[name]), "--threads", "1",
               "--vocoder-workers", "1", "--max-active", "2", "--log-level", "warning"]
        replicas[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, **ports))
    lb = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf")], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    try:
        for name in ("a", "b"):
            wait_healthy(urls[name], replicas[name], f"replica {name}")
        wait_healthy(urls["lb"], lb, "nginx", timeout=20)
        yield urls, replicas
    finally:
        for proc in (*replicas.values(), lb):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (*replicas.values(), lb):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def speak(url: str, **fields) -> bytes:
    body = {"model": "tts-1", "input": "Two servers, one voice.", "response_format": "wav", "seed": 7, **fields}
    r = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.content


def test_replicas_behind_nginx_share_the_work_voices_and_streams(cluster):
    urls, replicas = cluster
    before = {name: requests_served(urls[name]) for name in ("a", "b")}
    plain = [speak(urls["lb"]) for _ in range(4)]
    served = {name: requests_served(urls[name]) - before[name] for name in ("a", "b")}
    assert served == {"a": 2, "b": 2}, served  # round robin: both replicas work
    assert all(p == plain[0] for p in plain)  # same seed, same audio, whichever replica answered

    # A voice saved through the balancer (it lands on one replica) speaks the same on both.
    wav, sr = speech_prompt(3.0)
    buf = io.BytesIO()
    sf.write(buf, wav, sr, format="WAV")
    r = httpx.post(f"{urls['lb']}/v1/audio/voices", timeout=60,
                   files={"audio": ("me.wav", buf.getvalue(), "audio/wav")},
                   data={"name": "shared", "consent": CONSENT, "transcript": "A prompt for the shared voice."})
    assert r.status_code == 201, r.text
    cloned = {name: speak(urls[name], voice="shared") for name in ("a", "b")}
    assert cloned["a"] == cloned["b"]
    assert cloned["a"] != plain[0]
    assert len(sf.read(io.BytesIO(cloned["a"]))[0]) > 0.3 * 24000

    # Streaming through the balancer: chunks arrive before the response ends, and add up to the whole.
    arrivals, pcm = [], b""
    start = time.perf_counter()
    with httpx.stream("POST", f"{urls['lb']}/v1/audio/speech", timeout=120,
                      json={"model": "tts-1", "input": "Streaming through the balancer, chunk by chunk, as it is made.",
                            "response_format": "pcm", "stream": True, "seed": 7}) as resp:
        assert resp.status_code == 200
        for piece in resp.iter_bytes():
            arrivals.append(time.perf_counter() - start)
            pcm += piece
    assert len(arrivals) > 1 and arrivals[0] < arrivals[-1]
    assert len(np.frombuffer(pcm, dtype="<i2")) > 0.5 * 24000

    # The WebSocket passes the balancer (Upgrade headers).
    frames = 0
    with connect(f"ws://127.0.0.1:{urls['lb'].rsplit(':', 1)[1]}/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "session.config", "model": "tts-1", "seed": 7}))
        ws.send(json.dumps({"type": "input.text", "text": "Hello through the socket."}))
        ws.send(json.dumps({"type": "input.done"}))
        while True:
            msg = ws.recv(timeout=120)
            if isinstance(msg, bytes):
                frames += 1
                continue
            event = json.loads(msg)
            assert event.get("type") != "error", event
            if event["type"] == "audio.done":
                break
    assert frames > 0

    # One replica dies: the balancer routes around it and nothing is refused.
    replicas["a"].send_signal(signal.SIGTERM)
    replicas["a"].wait(timeout=30)
    after = [speak(urls["lb"]) for _ in range(3)]
    assert all(p == plain[0] for p in after)
