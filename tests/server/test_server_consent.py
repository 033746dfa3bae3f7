"""Consent records, the audit log and takedown over HTTP (a real uvicorn server) and from ``cadenza voices``."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys

import httpx
import numpy as np
import pytest

from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, PROMPT_SR, LiveServer, tone, wav_bytes

KEY, ADMIN = "test-key-0123456789", "admin-key-0123456789abc"


@pytest.fixture(scope="module")
def live(tts, tmp_path_factory):
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    app = create_app(tts, store, ServerConfig(api_key=KEY, admin_key=ADMIN))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        server.client, server.store = client, store
        yield server


def _as(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _create(c, name: str, audio: bytes, **fields) -> httpx.Response:
    return c.post("/v1/audio/voices", headers=_as(KEY), files={"audio": ("v.wav", audio, "audio/wav")},
                  data={"name": name, "consent": CONSENT, "transcript": "Just by listening.", **fields})


def test_consent_record_is_kept_exported_and_counts_uses(live):
    c = live.client
    audio = wav_bytes(tone(2.0))
    r = _create(c, "erin", audio, declared_by="Erin Example")
    assert r.status_code == 201, r.text
    voice = r.json()
    assert voice["declared_by"] == "Erin Example" and len(voice["audio_sha256"]) == 64
    for seed in (1, 2):
        s = c.post("/v1/audio/speech", headers=_as(KEY),
                   json={"model": "m", "input": "Hello there.", "voice": "erin", "seed": seed, "response_format": "pcm"})
        assert s.status_code == 200
    record = c.get(f"/v1/audio/voices/{voice['id']}/consent", headers=_as(KEY)).json()
    assert record["declaration"] == CONSENT and record["declared_by"] == "Erin Example" and record["uses"] == 2
    assert record["audio_sha256"] == voice["audio_sha256"] and record["last_used_at"] >= record["created_at"]
    assert c.get("/v1/audio/voices/nobody/consent", headers=_as(KEY)).status_code == 404


def test_takedown_needs_the_admin_key_and_blocks_the_recording(live):
    c = live.client
    audio = wav_bytes(tone(2.0, freq=180.0))
    voice = _create(c, "fred", audio).json()
    url = f"/v1/admin/voices/{voice['id']}/takedown"
    assert c.post(url, headers=_as(KEY), json={"reason": "asked"}).status_code == 401  # the API key is not enough
    assert c.get("/v1/admin/audit", headers=_as(KEY)).status_code == 401
    r = c.post(url, headers=_as(ADMIN), json={"reason": ""})
    assert r.status_code == 400
    r = c.post(url, headers=_as(ADMIN), json={"reason": "the speaker withdrew consent"})
    assert r.status_code == 200 and r.json()["id"] == voice["id"]
    assert c.get(f"/v1/audio/voices/{voice['id']}", headers=_as(KEY)).status_code == 404
    assert not (live.store.directory / "cache" / voice["id"]).exists()
    again = _create(c, "fred2", audio)
    assert again.status_code == 400 and again.json()["error"]["param"] == "audio"
    assert "taken down" in again.json()["error"]["message"]
    log = c.get("/v1/admin/audit", headers=_as(ADMIN), params={"voice": voice["id"]}).json()["data"]
    assert [e["event"] for e in log] == ["created", "takedown"] and log[1]["reason"] == "the speaker withdrew consent"
    everything = c.get("/v1/admin/audit", headers=_as(ADMIN)).json()["data"]
    assert everything[-1]["event"] == "blocked_attempt"
    assert all("input" not in e and "text" not in e for e in everything)  # no synthesised text is logged
    speech = c.post("/v1/audio/speech", headers=_as(KEY), json={"model": "m", "input": "Hi.", "voice": "fred"})
    assert speech.status_code == 400


def test_operator_endpoints_are_off_without_an_admin_key(tts, tmp_path):
    with VoiceStore(tmp_path / "v") as store, LiveServer(create_app(tts, store, ServerConfig())) as server:
        r = httpx.get(f"{server.url}/v1/admin/audit")
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    with pytest.raises(ValueError, match="admin_key"):
        ServerConfig(api_key=KEY, admin_key=KEY)


def test_cadenza_voices_offline(tmp_path):
    directory = tmp_path / "voices"
    with VoiceStore(directory) as store:
        gina = store.add("gina", (tone(1.0), PROMPT_SR), None, CONSENT, declared_by="Gina")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "cadenza", "voices", "--voices-dir", str(directory), *args],
                              capture_output=True, text=True, timeout=120)

    listed = [json.loads(line) for line in cli("list").stdout.splitlines()]
    assert [v["name"] for v in listed] == ["gina"] and listed[0]["declared_by"] == "Gina"
    assert json.loads(cli("consent", "gina").stdout)["audio_sha256"] == gina.audio_sha256
    assert cli("takedown", "gina").returncode == 2  # --reason is required
    assert json.loads(cli("takedown", "gina", "--reason", "request by email").stdout)["id"] == gina.id
    events = [json.loads(line)["event"] for line in cli("audit").stdout.splitlines()]
    assert events == ["created", "takedown"]
    missing = subprocess.run([sys.executable, "-m", "cadenza", "voices", "--voices-dir", str(tmp_path / "none"),
                              "list"], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "no voice store" in missing.stderr
    with VoiceStore(directory) as store, pytest.raises(Exception, match="taken down"):
        store.add("gina", (tone(1.0), PROMPT_SR), None, CONSENT)


def _files_hold(directory, needle: bytes) -> list[str]:
    """The files under the store's folder whose bytes contain ``needle``."""
    return [p.name for p in directory.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_retention_keeps_only_what_synthesis_needs_and_deletion_leaves_nothing(tts, tmp_path):
    import time

    from cadenza.errors import InputError
    from cadenza.voices.cosyvoice2_prompts import CosyVoice2Prompts

    rng = np.random.default_rng(0)
    samples = (tone(2.0) + 0.05 * rng.standard_normal(int(2.0 * PROMPT_SR))).astype(np.float32)
    pcm = np.round(np.clip(samples, -1, 1) * 32767).astype("<i2")
    needle = pcm[8000:8016].tobytes()  # 32 bytes of the recording: found only where the recording is stored
    directory = tmp_path / "voices"
    with VoiceStore(directory) as store:
        library = CosyVoice2Prompts(tts, store)
        lean = library.create("lean", (samples, PROMPT_SR), "Just by listening.", CONSENT)  # the default
        assert not lean.audio_kept and _files_hold(directory, needle) == []
        with pytest.raises(InputError, match="keeps no recording"):
            store.audio(lean.id)
        library.forget(lean.id)
        voice = library.resolve("lean")  # from the pinned features, not from audio
        handle = tts.engine.scheduler.submit(tts.plan(["Hello there."], voice, seed=1).requests[0], stream=True)
        assert sum(len(c) for c in handle) > 0
        primed = tts.engine.scheduler._primed
        assert primed is None or voice.prompt in primed
        store.delete(lean.id)
        library.forget(lean.id)
        assert primed is None or voice.prompt not in primed
        kept = library.create("kept", (samples, PROMPT_SR), None, CONSENT, keep_audio=True, audio_ttl_s=0.5)
        assert kept.audio_kept and kept.audio_expires_at is not None
        assert _files_hold(directory, needle), "a kept recording is in the store"
        time.sleep(0.6)
        assert store.drop_expired_audio() == 1
        assert not store.get("kept").audio_kept and _files_hold(directory, needle) == []
        library.forget(kept.id)
        assert library.resolve("kept").prompt is not None  # still usable: its features are pinned
        assert [e.event for e in store.audit_log(kept.id)] == ["created", "audio_expired"]
        again = library.create("again", (samples, PROMPT_SR), None, CONSENT, keep_audio=True)
        store.delete(again.id)
        assert _files_hold(directory, needle) == []  # deleted rows are zeroed, the log folded in
    with contextlib.closing(sqlite3.connect(directory / "voices.sqlite3")) as db:
        leftovers = db.execute("SELECT count(*) FROM voice_features WHERE voice_id IN (?, ?)", (lean.id, again.id))
        assert leftovers.fetchone()[0] == 0 and not (directory / "cache" / again.id).exists()
