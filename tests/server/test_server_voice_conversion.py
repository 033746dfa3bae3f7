"""``POST /v1/audio/voice-conversion`` on a live server (real uvicorn on loopback, real HTTP client): the server says
what the Python API's ``convert_voice`` says, streamed and whole, into a saved voice or the default voice, with the
source's transcript on the built-in model; every bad form field is a specific 400 before any model work."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

import cadenza
from cadenza.audio.resample import resample
from cadenza.audio.wav_stream import pcm16
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, PROMPT_SR, LiveServer, api_error, speech_prompt, tone, wav_bytes

ENDPOINT = "/v1/audio/voice-conversion"
TRANSCRIPT = "Just by listening a few minutes a day."


@pytest.fixture(scope="module")
def live(tts, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    config = ServerConfig(max_upload_bytes=400_000, max_conversion_seconds=40.0)
    with LiveServer(create_app(tts, store, config)) as server:
        server.store = store
        with httpx.Client(base_url=server.url, timeout=120) as client:
            server.client = client
            files = {"audio": ("alice.wav", wav_bytes(tone(2.0)), "audio/wav")}
            r = client.post("/v1/audio/voices", files=files, data={"name": "alice", "transcript": TRANSCRIPT,
                                                                      "consent": CONSENT, "keep_audio": "true"})
            assert r.status_code == 201, r.text
            server.alice = r.json()["id"]
            yield server


@pytest.fixture(scope="module")
def source() -> tuple[np.ndarray, int]:
    samples, sr = speech_prompt(2.5)
    return (samples if samples.ndim == 1 else samples.mean(axis=1)).astype(np.float32), sr


def _convert(live, audio: bytes, **fields) -> httpx.Response:
    fields = {"voice": "alice", **fields}
    return live.client.post(ENDPOINT, files={"audio": ("source.wav", audio, "audio/wav")},
                            data={k: str(v) for k, v in fields.items() if v is not None})


def test_conversion_says_what_the_python_api_says(tts, live, source):
    """Whole (``stream=false``): exactly ``convert_voice`` into the same stored recording, same seed; streamed: the
    same length within a chunk, marked by the same provenance watermark path."""
    samples, sr = source
    r = _convert(live, wav_bytes(samples, sr), voice="alice", seed=3, stream="false", response_format="pcm")
    assert r.status_code == 200, r.text
    assert r.headers["x-seed"] == "3" and r.headers["x-sample-rate"] == str(tts.sample_rate)
    prompt = live.store.audio(live.alice)
    # the source as the server decodes it: 16-bit WAV, at its own rate
    decoded = np.frombuffer(pcm16(samples), dtype="<i2").astype(np.float32) / 32768.0
    expected = tts.convert_voice((decoded, sr), prompt, seed=3)
    assert r.content == pcm16(expected.samples)
    seconds = expected.samples.size / tts.sample_rate
    assert abs(seconds - samples.size / sr) < 0.1  # one hop of audio per source token
    streamed = _convert(live, wav_bytes(samples, sr), voice="alice", seed=3, response_format="pcm")
    assert streamed.status_code == 200, streamed.text
    n = len(streamed.content) // 2
    assert abs(n - expected.samples.size) <= tts.sample_rate // 2, (n, expected.samples.size)
    wav = _convert(live, wav_bytes(samples, sr), voice="alice", seed=3, response_format="wav", stream="false")
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    assert wav.content[:4] == b"RIFF" and wav.content[44:] == r.content


def test_bad_forms_are_specific_400s(live, source):
    samples, sr = source
    good = wav_bytes(samples, sr)
    r = live.client.post(ENDPOINT, json={"audio": "x"})
    assert api_error(r, 415)["code"] == "unsupported_media_type"
    r = live.client.post(ENDPOINT, files={"voice": (None, "alice")})
    assert api_error(r, 400, "audio")["code"] == "missing_field"
    assert api_error(_convert(live, b""), 400, "audio")["code"] == "invalid_audio"
    assert "decode" in api_error(_convert(live, b"not audio at all" * 10), 400, "audio")["message"]
    assert "silent" in api_error(_convert(live, wav_bytes(np.zeros(PROMPT_SR * 2, np.float32))), 400,
                                 "audio")["message"]
    assert api_error(_convert(live, wav_bytes(tone(0.1))), 400, "audio")
    assert api_error(_convert(live, wav_bytes(tone(14.0))), 413, "audio")["code"] == "file_too_large"
    assert "40" in api_error(_convert(live, wav_bytes(tone(41.0, 8000), 8000, subtype="PCM_U8")), 400, "audio")["message"]
    assert api_error(_convert(live, good, voice="nobody"), 400, "voice")["code"] == "voice_not_found"
    err = api_error(_convert(live, good, voice=None), 400, "voice")  # the toy model has no default voice
    assert "no default voice" in err["message"]
    assert api_error(_convert(live, good, voice="alice", response_format="ogg"), 400, "response_format")
    assert api_error(_convert(live, good, voice="alice", seed="-1"), 400, "seed")
    assert api_error(_convert(live, good, voice="alice", seed="seven"), 400, "seed")
    assert api_error(_convert(live, good, voice="alice", stream="maybe"), 400, "stream")
    assert api_error(_convert(live, good, voice="alice", speed="2"), 400, "speed")["code"] == "unknown_parameter"
    # the toy model's speech tokens are not phonemes: a transcript cannot place them
    err = api_error(_convert(live, good, voice="alice", source_text="Hello there."), 400, "source_text")
    assert "phonemes" in err["message"]
    r = live.client.post(ENDPOINT, files={"audio": ("a.wav", good, "audio/wav"), "voice": ("v.wav", good)})
    assert api_error(r, 400)


def test_a_source_longer_than_one_request_may_make_is_refused_not_cut(tts, tmp_path, source):
    """The output is as long as the source, so a source past ``max_audio_seconds`` (below ``max_conversion_seconds``)
    is refused with the figure, after decoding and before any model work, instead of coming back cut at the limit
    with a 200."""
    samples, sr = source
    config = ServerConfig(max_inflight_audio_seconds=2.0, max_audio_seconds=2.0)
    with VoiceStore(tmp_path) as store, LiveServer(create_app(tts, store, config)) as server:
        r = httpx.post(f"{server.url}/v1/audio/voices", files={"audio": ("alice.wav", wav_bytes(tone(2.0)), "audio/wav")},
                       data={"name": "alice", "transcript": TRANSCRIPT, "consent": CONSENT})
        assert r.status_code == 201, r.text
        steps = tts.engine.scheduler.state.lm_steps
        files = {"audio": ("s.wav", wav_bytes(np.tile(samples, 2), sr), "audio/wav")}
        r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data={"voice": "alice"}, timeout=60)
        err = api_error(r, 400, "audio")
        assert "2 s" in err["message"] and tts.engine.scheduler.state.lm_steps == steps


@pytest.fixture(scope="module")
def tiny():
    tts = cadenza.load()  # the built-in model: phoneme speech tokens, a default voice
    yield tts
    tts.close()


def test_builtin_model_with_the_source_text(tiny, tmp_path_factory):
    """The built-in model converts into its default voice when no voice is named (OpenAI voice names too), and with
    ``source_text`` places the source's tokens by alignment, exactly as ``convert_voice(source_text=)`` does."""
    text = "Please close the window before you leave."
    made = tiny.synthesize(text, speed=1.2, seed=2)  # a voice it has not heard: faster and higher
    src = resample(torch.from_numpy(made.samples), int(made.sample_rate * 1.2), made.sample_rate).numpy()
    with VoiceStore(tmp_path_factory.mktemp("tiny-voices")) as store, \
            LiveServer(create_app(tiny, store, ServerConfig())) as server:
        files = {"audio": ("s.wav", wav_bytes(src, made.sample_rate), "audio/wav")}
        for voice in (None, "alloy"):
            data = {"source_text": text, "seed": "0", "stream": "false", "response_format": "pcm"}
            if voice:
                data["voice"] = voice
            r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data=data, timeout=120)
            assert r.status_code == 200, r.text
            decoded = np.frombuffer(pcm16(src), dtype="<i2").astype(np.float32) / 32768.0
            expected = tiny.convert_voice((decoded, made.sample_rate), seed=0, source_text=text)
            assert r.content == pcm16(expected.samples)
        r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data={"source_text": " "}, timeout=60)
        assert api_error(r, 400, "source_text")
        r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data={"source_text": "word " * 20_000}, timeout=60)
        assert "source_text" in api_error(r, 400, "source_text")["message"]
        r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data={"source_text": (text + " ") * 12}, timeout=60)
        assert "transcript" in api_error(r, 400, "source_text")["message"]  # more phonemes than the audio has frames
        # streamed WAV: carries the provenance watermark like every synthesis, and a request cannot turn it off
        r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data={"response_format": "wav"}, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        found = httpx.post(f"{server.url}/v1/audio/detect", files={"audio": ("c.wav", r.content, "audio/wav")}).json()
        assert found["found"], found
        r = httpx.post(f"{server.url}{ENDPOINT}", files=files, data={"watermark": "false"}, timeout=60)
        assert api_error(r, 400, "watermark")["code"] == "unknown_parameter"


def test_concurrent_conversions_each_say_what_they_say_alone_and_free_their_slots(live, source):
    """Six conversions at once (three sources, six seeds) each answer what it answers alone (to a 16-bit step or two:
    requests vocoded in one batch may round differently, tests/engine/test_engine_vocoder_batch.py); afterwards no
    admission slot or engine request is left held."""
    from concurrent.futures import ThreadPoolExecutor

    samples, sr = source
    sources = [wav_bytes(samples[: int(sr * s)], sr) for s in (1.2, 1.8, 2.4)]
    jobs = [(k % 3, 10 + k) for k in range(6)]

    def one(job):
        index, seed = job
        r = _convert(live, sources[index], seed=seed, stream="false", response_format="pcm")
        assert r.status_code == 200, r.text
        return r.content

    alone = [one(job) for job in jobs]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(one, jobs))
    for a, b in zip(alone, together):
        a, b = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
        assert a.size == b.size and np.abs(a - b).max() <= 2
    health = live.client.get("/health").json()
    assert health["inflight"] == 0 and health["active"] == 0 and health["queued"] == 0, health


def test_a_source_past_30_seconds_is_converted_chunk_by_chunk(live):
    """35 s (past the speech tokenizer's 30 s): read in windows, rendered chunk by chunk even when asked whole, one
    hop of audio per 40 ms token; ``max_conversion_seconds`` bounds it (at most 600)."""
    source = wav_bytes(tone(35.0, 8000), 8000, subtype="PCM_U8")
    r = _convert(live, source, seed=1, stream="false", response_format="pcm")
    assert r.status_code == 200, r.text
    assert len(r.content) // 2 == 35 * 25 * 960  # 875 tokens of 960 samples at 24 kHz
    with pytest.raises(ValueError, match="max_conversion_seconds"):
        ServerConfig(max_conversion_seconds=601)
