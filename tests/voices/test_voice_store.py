"""VoiceStore: validation, persistence, the prompt-feature cache, path safety, threads and processes -- on both
backends (``voices_location``: an SQLite folder, then a fresh PostgreSQL database; see conftest.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.errors import AudioError, InputError, UnknownSpeakerError
from cadenza.voices import VoiceStore, prompt_cache_key
from cadenza.voices.migrations import SCHEMA_VERSION

SR = 16000
CONSENT = "I, the speaker, agree that this recording may be used to synthesise my voice."


def _tone(seconds: float, sr: int = SR, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def _wav(x: np.ndarray, sr: int, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.fixture
def store(voices_location) -> VoiceStore:
    with VoiceStore(voices_location) as s:
        yield s


@pytest.fixture(scope="module")
def shared_store(module_voices_location) -> VoiceStore:
    """One store per backend for the tests that only check what is refused (validation happens before the backend;
    these check that nothing reaches it)."""
    with VoiceStore(module_voices_location) as s:
        yield s


def _is_postgres(location: str) -> bool:
    return location.startswith("postgresql://")


def _sql(url: str, statement: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        cursor = db.execute(statement)
        return cursor.fetchall() if cursor.description else []


def _leftover_features(location: str) -> list:
    """Cached features still stored anywhere (files beside SQLite, rows in PostgreSQL)."""
    if _is_postgres(location):
        return _sql(location, "SELECT voice_id FROM prompt_cache UNION ALL SELECT voice_id FROM voice_features")
    return list((Path(location) / "cache").glob("*/*.safetensors"))


def test_add_get_list_delete_round_trip(store):
    x = _tone(1.5)
    rec = store.add("Alice", (x, SR), "Hello there.", CONSENT)
    assert rec.id.startswith("voice_") and rec.name == "Alice" and rec.transcript == "Hello there."
    assert rec.consent == CONSENT and rec.sample_rate == SR and rec.duration == pytest.approx(1.5)
    assert abs(rec.created_at - time.time()) < 60 and rec.consent_at == rec.created_at
    assert store.get(rec.id) == rec and store.get("alice") == rec  # names are case-insensitive
    assert [r.id for r in store.list()] == [rec.id]
    samples, sr = store.audio(rec.id)
    assert sr == SR and samples.dtype == np.float32
    np.testing.assert_allclose(samples, x, atol=1.0 / 32767)  # 16-bit storage
    bob = store.add("bob 2.0_x-y", _wav(_tone(1.0, 44100, channels=2), 44100), None, CONSENT)
    assert bob.transcript is None and bob.sample_rate == 44100  # native rate kept up to 48 kHz
    hi = store.add("hi-rate", (_tone(1.0, 96000), 96000), "x", CONSENT)
    assert hi.sample_rate == 48000 and store.audio(hi.id)[0].shape == (48000,)
    assert [r.name for r in store.list()] == ["Alice", "bob 2.0_x-y", "hi-rate"]
    store.delete(rec.id)
    assert rec.id not in store and "Alice" not in store
    with pytest.raises(UnknownSpeakerError, match="unknown voice"):
        store.get("Alice")
    with pytest.raises(UnknownSpeakerError):
        store.delete(rec.id)
    assert store.add("Alice", (x, SR), "again", CONSENT).id != rec.id  # the name is free again


def test_consent_is_required_and_kept_verbatim(store):
    x = (_tone(1.0), SR)
    for consent in (None, "", "   \n"):
        with pytest.raises(InputError, match="consent"):
            store.add("carol", x, "hi", consent)
    verbatim = "  I agree.\nSigned: Carol  "
    assert store.get(store.add("carol", x, "hi", verbatim).id).consent == verbatim
    with pytest.raises(InputError, match="already exists"):
        store.add("CAROL", x, "hi", CONSENT)
    with pytest.raises(InputError, match="transcript is empty"):
        store.add("dave", x, "  ", CONSENT)


@pytest.mark.parametrize("name", ["", " alice", "alice ", "a/b", "../../etc/passwd", "..", "...", "a\\b", "a\x00b",
                                  "x" * 65, "caf\u00e9/", "voice_" + "A" * 22, "-_-", "a\nb", 42])
def test_bad_names_are_rejected(shared_store, name):
    with pytest.raises(InputError, match="invalid voice name"):
        shared_store.add(name, (_tone(1.0), SR), "hi", CONSENT)


def test_unicode_names(store):
    for name in ("Zo\u00eb", "李雷", "voice 1.0"):
        rec = store.add(name, (_tone(1.0), SR), "hi", CONSENT)
        assert store.get(name) == rec
    assert store.get("Zoe\u0308").name == "Zo\u00eb"  # NFD spelling finds the NFC-stored name
    with pytest.raises(InputError, match="already exists"):
        store.add("Zoe\u0308", (_tone(1.0), SR), "hi", CONSENT)


@pytest.mark.parametrize(
    ("audio", "match"),
    [((np.zeros(SR * 2, np.float32), SR), "silent"), ((_tone(0.2), SR), "too short"), ((_tone(31.0), SR), "too long"),
     (b"RIFF\x00\x00not audio", "cannot decode"), (b"", "empty"), ((np.full(SR, np.nan, np.float32), SR), "NaN"),
     ((_tone(1.0), 1000), "sample rate"), ("/etc/passwd", "encoded bytes")],
)
def test_bad_audio_is_rejected(shared_store, audio, match):
    with pytest.raises(AudioError, match=match):
        shared_store.add("eve", audio, "hi", CONSENT)
    assert "eve" not in shared_store


def test_upload_size_limit(voices_location):
    small = VoiceStore(voices_location, max_audio_bytes=10_000)
    with pytest.raises(AudioError, match="MiB limit"):
        small.add("big", _wav(_tone(2.0), SR), "hi", CONSENT)
    limited = VoiceStore(voices_location, max_seconds=2.0)
    with pytest.raises(AudioError, match="too long"):
        limited.add("long", (_tone(2.5), SR), "hi", CONSENT)


def test_persistence_across_reopen(voices_location):
    d = voices_location
    with VoiceStore(d) as s:
        rec = s.add("frank", (_tone(1.0), SR), "Hello.", CONSENT)
        s.cache_prompt(rec.id, "cv2-abc", {"embedding": torch.arange(6.0).reshape(1, 6)})
    with VoiceStore(d) as s:
        assert s.get("frank") == rec
        np.testing.assert_allclose(s.audio(rec.id)[0], _tone(1.0), atol=1.0 / 32767)
        assert torch.equal(s.cached_prompt(rec.id, "cv2-abc")["embedding"], torch.arange(6.0).reshape(1, 6))
    if not _is_postgres(d):
        assert oct(Path(d).stat().st_mode & 0o777) == oct(0o700)


def test_prompt_cache(store):
    rec = store.add("gina", (_tone(1.0), SR), "Hello.", CONSENT)
    assert store.cached_prompt(rec.id, "cv2-0123") is None
    tensors = {"prompt_text": torch.tensor([[1, 2, 3]], dtype=torch.int32), "mel": torch.randn(4, 80).t()}  # non-contiguous
    store.cache_prompt(rec.id, "cv2-0123", tensors)
    got = store.cached_prompt(rec.id, "cv2-0123")
    assert set(got) == set(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)
    assert store.cached_prompt(rec.id, "cv2-other") is None
    if store.directory is not None:
        path = store.directory / "cache" / rec.id / "cv2-0123.safetensors"
        assert path.is_file() and not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]
        path.write_bytes(b"garbage")  # a corrupt file is dropped, not fatal
        assert store.cached_prompt(rec.id, "cv2-0123") is None and not path.exists()
    else:
        _sql(store.backend._url, "UPDATE prompt_cache SET data = 'garbage'")  # a corrupt row: dropped, not fatal
        assert store.cached_prompt(rec.id, "cv2-0123") is None
        assert _sql(store.backend._url, "SELECT count(*) FROM prompt_cache") == [(0,)]
    store.cache_prompt(rec.id, "cv2-0123", tensors)
    store.delete(rec.id)
    assert store.directory is None or not (store.directory / "cache" / rec.id).exists()
    assert store.cached_prompt(rec.id, "cv2-0123") is None
    with pytest.raises(UnknownSpeakerError):
        store.cache_prompt(rec.id, "cv2-0123", tensors)
    with pytest.raises(InputError):
        store.cache_prompt(store.add("h", (_tone(1.0), SR), "x", CONSENT).id, "cv2-0123", {})


def test_cache_key_tracks_the_files(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.txt"
    a.write_bytes(b"1234")
    b.write_text("x")
    key = prompt_cache_key([a, b, None])
    assert key == prompt_cache_key([a, b, None]) and key.startswith("cv2-")
    a.write_bytes(b"12345")
    assert prompt_cache_key([a, b, None]) != key


@pytest.mark.parametrize("bad_id", ["../../etc/passwd", "voice_../../../../../../etc", "voice_" + "a" * 21 + "/",
                                    "voice_" + "a" * 23, "/abs/path", "voice_" + "." * 22, "", "alice"])
def test_traversal_in_ids_is_rejected(shared_store, tmp_path, bad_id):
    store = shared_store
    _alice(store)
    root = store.directory.parent if store.directory is not None else tmp_path
    before = sorted(p for p in root.rglob("*"))
    for call in (lambda: store.audio(bad_id), lambda: store.delete(bad_id),
                 lambda: store.cached_prompt(bad_id, "cv2-x"), lambda: store.cache_prompt(bad_id, "cv2-x", {"a": torch.ones(1)})):
        with pytest.raises(UnknownSpeakerError, match="invalid voice id"):
            call()
    assert sorted(p for p in root.rglob("*")) == before
    assert [r.name for r in store.list()] == ["alice"]


@pytest.mark.parametrize("bad_key", ["../x", "a/b", "..", ".hidden", "", "a" * 65, "a\x00"])
def test_traversal_in_model_keys_is_rejected(shared_store, bad_key):
    rec = _alice(shared_store)
    with pytest.raises(InputError, match="model key"):
        shared_store.cache_prompt(rec.id, bad_key, {"a": torch.ones(1)})
    with pytest.raises(InputError, match="model key"):
        shared_store.cached_prompt(rec.id, bad_key)


def _alice(store: VoiceStore):
    """The shared store's one voice (made by the first test that needs it)."""
    return store.get("alice") if "alice" in store else store.add("alice", (_tone(1.0), SR), "hi", CONSENT)


def test_concurrent_threads(voices_location):
    store = VoiceStore(voices_location)
    errors: list[BaseException] = []
    kept: dict[int, str] = {}

    def worker(t: int) -> None:
        try:
            ids = [store.add(f"t{t}-{i}", (_tone(0.6 + 0.1 * i), SR), f"text {i}", CONSENT).id for i in range(4)]
            for vid in ids[:3]:
                store.cache_prompt(vid, "cv2-k", {"x": torch.full((2,), float(t))})
                assert store.cached_prompt(vid, "cv2-k")["x"][0] == t
                assert vid in {r.id for r in store.list()}
                store.delete(vid)
            kept[t] = ids[3]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    assert sorted(r.id for r in store.list()) == sorted(kept.values())
    assert _leftover_features(voices_location) == []
    # Same name from several threads at once: exactly one wins.
    results: list[str] = []

    def same_name() -> None:
        try:
            store.add("contested", (_tone(1.0), SR), "x", CONSENT)
            results.append("ok")
        except InputError:
            results.append("taken")

    threads = [threading.Thread(target=same_name) for _ in range(5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert sorted(results) == ["ok"] + ["taken"] * 4


_CHILD = """
import sys, numpy as np
from cadenza.voices import VoiceStore
from cadenza.errors import InputError
store = VoiceStore(sys.argv[1])
x = (0.3 * np.sin(np.arange(16000) / 3.0)).astype(np.float32)
for i in range(5):
    store.add(f"{sys.argv[2]}-{i}", (x, 16000), "hello", "I agree.")
    store.list()
try:
    store.add("shared-name", (x, 16000), "hello", "I agree.")
    print("won")
except InputError:
    print("lost")
"""


def test_concurrent_processes(tmp_path):
    """SQLite's file locking across processes (PostgreSQL's writers on separate connections:
    test_voice_store_replicas.py)."""
    d = str(tmp_path / "voices")
    VoiceStore(d).close()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(d), f"p{k}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for k in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert sorted(o[0].strip() for o in outs) == ["lost", "won"]
    names = {r.name for r in VoiceStore(d).list()}
    assert names == {f"p{k}-{i}" for k in range(2) for i in range(5)} | {"shared-name"}


def test_opening_a_store_sweeps_old_half_written_cache_files(tmp_path):
    import os
    import time

    VoiceStore(tmp_path).close()
    folder = tmp_path / "cache" / "voice_abcdefghijklmnopqrstuv"
    folder.mkdir(parents=True)
    old, fresh = folder / ".tmp-old.safetensors", folder / ".tmp-new.safetensors"
    old.write_bytes(b"half")
    fresh.write_bytes(b"being written by another process")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    VoiceStore(tmp_path).close()
    assert not old.exists() and fresh.exists()


def test_a_store_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    from cadenza.errors import InputError

    (tmp_path / "voices.sqlite3").write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(InputError, match="cannot open the voice store .*voices.sqlite3"):
        VoiceStore(tmp_path)


def test_voices_keep_the_family_they_were_made_for(voices_location):
    d = voices_location
    with VoiceStore(d) as s:
        cv2 = s.add("ann", (_tone(1.0), SR), "Hello.", CONSENT)
        vx2 = s.add("ben", (_tone(1.0), SR), None, CONSENT, family="voxcpm2", cloning="reference")
        with pytest.raises(InputError, match="family"):
            s.add("cal", (_tone(1.0), SR), None, CONSENT, family="../x")
    with VoiceStore(d) as s:
        assert (s.get("ann").family, s.get("ann").cloning) == ("cosyvoice2", None) and s.get("ann") == cv2
        assert (s.get("ben").family, s.get("ben").cloning) == ("voxcpm2", "reference") and s.get("ben") == vx2


def test_a_schema_2_store_opens_with_every_voice_made_for_cosyvoice2(tmp_path):
    import sqlite3

    d = tmp_path / "voices"
    with VoiceStore(d) as s:
        rec = s.add("old", (_tone(1.0), SR), "Hello.", CONSENT)
    with sqlite3.connect(d / "voices.sqlite3") as db:  # what a Cadenza of schema 2 wrote: no family columns
        db.execute("ALTER TABLE voices DROP COLUMN family")
        db.execute("ALTER TABLE voices DROP COLUMN cloning")
        db.execute("PRAGMA user_version = 2")
    with VoiceStore(d) as s:
        assert s.get("old") == rec and s.get("old").family == "cosyvoice2"
        new = s.add("new", (_tone(1.0), SR), None, CONSENT, family="voxcpm2", cloning="reference")
        assert [r.family for r in s.list()] == ["cosyvoice2", "voxcpm2"] and s.get("new") == new
    with sqlite3.connect(d / "voices.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5


def test_consent_record_audit_log_and_takedown(voices_location):
    import sqlite3

    pcm = np.round(_tone(1.0) * 32767).astype(np.int16)  # a 16-bit recording, sent as WAV and as (lossless) FLAC
    with VoiceStore(voices_location) as s:
        rec = s.add("dana", _wav(pcm, SR), "Hello.", CONSENT, declared_by="Dana Smith")
        s.record_use(rec.id)
        s.record_use(rec.id)
        consent = s.consent_record("dana")
        assert consent["declaration"] == CONSENT and consent["declared_by"] == "Dana Smith" and consent["uses"] == 2
        assert consent["audio_sha256"] == rec.audio_sha256 and len(rec.audio_sha256) == 64
        again = s.add("dana2", _wav(pcm, SR, "FLAC"), None, CONSENT)  # the same samples in another format
        assert again.audio_sha256 == rec.audio_sha256
        s.delete(again.id)
        with pytest.raises(InputError, match="reason"):
            s.takedown("dana", " ")
        removed = s.takedown("dana", "the speaker asked us to")
        assert removed["id"] == rec.id and removed["uses"] == 2 and "dana" not in s
        assert _leftover_features(voices_location) == [] and s.cached_prompt(rec.id, "cv2-x") is None
        with pytest.raises(InputError, match="taken down"):
            s.add("dana3", _wav(pcm, SR), None, CONSENT)
        s.add("tone", (0.5 * _tone(1.0), SR), None, CONSENT)  # other samples: fine
        events = [(e.event, e.voice_id) for e in s.audit_log()]
        assert events[:4] == [("created", rec.id), ("created", again.id), ("deleted", again.id),
                              ("takedown", rec.id)]
        assert events[4] == ("blocked_attempt", None) and events[5][0] == "created"
        assert [e.event for e in s.audit_log(rec.id)] == ["created", "takedown"]
        assert s.audit_log(rec.id)[-1].detail["reason"] == "the speaker asked us to"
    if _is_postgres(voices_location):  # the log cannot be rewritten
        import psycopg

        for statement in ("DELETE FROM audit", "UPDATE audit SET event = 'created'", "TRUNCATE audit"):
            with pytest.raises(psycopg.Error, match="append-only"):
                _sql(voices_location, statement)
        return
    with sqlite3.connect(Path(voices_location) / "voices.sqlite3") as db:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM audit")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE audit SET event = 'created'")


def test_a_library_caller_s_mistyped_voices_dir_is_refused_not_created(tmp_path):
    """``voices_dir=`` (``cadenza.load``, ``from_pretrained``): a new store only inside an existing folder; a missing
    parent (a typo) or a file is an ``InputError`` and nothing is created (it silently became an empty store)."""
    from cadenza.errors import InputError
    from cadenza.voices import open_voices

    assert open_voices(None) is None
    with pytest.raises(InputError, match="does not exist, nor does its folder"):
        open_voices(tmp_path / "typo" / "voices")
    assert not (tmp_path / "typo").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        open_voices(tmp_path / "file")
    with open_voices(tmp_path / "new") as store:
        assert store.list() == [] and (tmp_path / "new").is_dir()
