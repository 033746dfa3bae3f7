"""``POST /v1/audio/detect`` and ``cadenza detect`` read back every output the server writes, in every format and
``stream`` mode (docs/provenance.md), and the m4a / WebM recordings the voice upload takes. The streamed FLAC (no
length in its STREAMINFO: libsndfile failed with "Internal psf_fseek() failed") and AAC ("Format not recognised")
were a 400 before detect shared the decode path of the voice upload."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest

import cadenza
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore
from helpers import run_cli

from test_server_harness import LiveServer

TEXT = "Hello there, this sentence is long enough to carry the whole provenance mark and its payload."


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with cadenza.load() as tiny, VoiceStore(tmp_path_factory.mktemp("voices")) as store:  # real speech, 24 kHz
        with LiveServer(create_app(tiny, store, ServerConfig())) as server:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                server.client, server.tiny = client, tiny
                server.names = [m["id"] for m in client.get("/v1/models").json()["data"]]
                yield server


def _speech(live, fmt: str, stream: bool) -> bytes:
    r = live.client.post("/v1/audio/speech", json={"model": "m", "input": TEXT, "seed": 3, "response_format": fmt,
                                                   "stream": stream})
    assert r.status_code == 200, r.text
    return r.content


def _detect(live, data: bytes, name: str) -> dict:
    r = live.client.post("/v1/audio/detect", files={"audio": (name, data, "application/octet-stream")})
    assert r.status_code == 200, (name, r.text)
    return r.json()


@pytest.mark.parametrize("fmt", ["flac", "aac", "mp3", "opus", "wav"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_detect_reads_every_output_format_and_stream_mode(live, fmt, stream):
    data = _speech(live, fmt, stream)
    if fmt == "flac" and stream:  # what broke it: STREAMINFO says total_samples = 0 ("unknown")
        assert int.from_bytes(data[18:26], "big") & ((1 << 36) - 1) == 0
    found = _detect(live, data, f"out.{fmt}")
    assert found["found"], (fmt, stream, found)
    if found["payload"] is not None:  # read when enough of the utterance carries it (docs/provenance.md)
        assert int(found["payload"], 16) == live.tiny.mark.payload and found["payload_matches"] == live.names


def test_the_cli_reads_the_streamed_flac_and_aac(live, tmp_path, capsys):
    for fmt, stream in (("flac", True), ("aac", False)):
        path = tmp_path / f"out.{fmt}"
        path.write_bytes(_speech(live, fmt, stream))
        code, out, err = run_cli(capsys, "detect", path)
        assert code == 0, (fmt, err)
        assert json.loads(out)["found"] is True, (fmt, out)


@pytest.mark.parametrize("fmt, codec", [("ipod", "aac"), ("webm", "libopus")], ids=["m4a", "webm"])
def test_detect_takes_what_the_voice_upload_takes(live, fmt, codec):
    av = pytest.importorskip("av", reason="PyAV writes the m4a / WebM input")
    whole = live.tiny.synthesize(TEXT, seed=3)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        rate = 48_000 if codec == "libopus" else whole.sample_rate
        stream = container.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(whole.samples[None, :].astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = whole.sample_rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    assert _detect(live, buf.getvalue(), f"memo.{fmt}")["found"]
