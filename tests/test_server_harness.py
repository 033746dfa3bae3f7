"""Shared helpers of the server tests (no tests here): a real uvicorn server on 127.0.0.1 in a thread."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf

CONSENT = "I am the speaker in this recording and I agree to it being used to synthesise my voice."
PROMPT_SR = 16000


class LiveServer:
    """``uvicorn.Server`` on a free loopback port, served from a background thread."""

    def __init__(self, app, server_config=None) -> None:
        """``server_config``: run with ``cadenza serve``'s uvicorn settings for it (header deadline, connection
        limit); else plain uvicorn."""
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        if server_config is not None:
            from cadenza.server.protocol import uvicorn_config

            config = uvicorn_config(app, server_config, log_level="warning", timeout_graceful_shutdown=2,
                                    ws_ping_interval=None)
        else:
            config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, ws_ping_interval=None)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()


AUDIO_DIR = Path(os.environ.get("CADENZA_SHARED_AUDIO") or Path(__file__).resolve().parents[1] / "../shared/audio")


def speech_prompt(seconds: float = 3.0) -> tuple[np.ndarray, int]:
    """Real speech when the shared audio is there (the toy LM behaves better on it than on a tone), else a tone."""
    path = AUDIO_DIR / "en_stereo_44k.wav"
    if path.is_file():
        data, sr = sf.read(path, dtype="float32")
        return data[: int(seconds * sr)], sr
    return tone(seconds), PROMPT_SR


def tone(seconds: float, sr: int = PROMPT_SR, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * freq * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def wav_bytes(x: np.ndarray, sr: int = PROMPT_SR, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


def api_error(r, status: int, param: str | None = "__any__") -> dict:
    """The ``error`` object of an httpx response that must have ``status``; its ``param`` checked unless "__any__"."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    if param != "__any__":
        assert err["param"] == param, err
    return err


def wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def drain_ws(ws, timeout: float = 120) -> tuple[list[dict], bytes, int | None]:
    """Everything a WebSocket server sends until it closes: (its JSON messages, its binary messages joined, the close
    code)."""
    from websockets.exceptions import ConnectionClosed

    events, audio = [], b""
    try:
        while True:
            message = ws.recv(timeout=timeout)
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
    except ConnectionClosed as closed:
        return events, audio, closed.rcvd.code if closed.rcvd else None
