"""The voice store shared by several server replicas: PostgreSQL (a real server, see conftest.py) -- migrations,
two stores and two live servers on one database, concurrent writers, a lost connection, the audit log's triggers.
(Behaviour both backends share is tested against both in test_voice_store.py.)"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.errors import InputError, UnknownSpeakerError
from cadenza.text.lexicon import Lexicon
from cadenza.voices import VoiceStore
from cadenza.voices.backend import VoiceStoreUnavailableError
from cadenza.voices.lexicons import VoiceLexicons
from cadenza.voices.migrations import SCHEMA_VERSION, SchemaTooNewError, migrate_postgres

SR = 16000
CONSENT = "I, the speaker, agree that this recording may be used to synthesise my voice."
LEXICON = Lexicon.from_json([{"word": "Cadenza", "respelling": "ka den za"}])
# What Cadenza made on a schema-4 database with the first lexicon saved, for a few hours before schema 5 (its
# lexicons.py, commit b1438e2): the table (PostgreSQL with a foreign key, SQLite with a trigger instead), and a row.
_LAZY_TABLE = ("CREATE TABLE IF NOT EXISTS voice_lexicons (voice_id TEXT PRIMARY KEY{fk}, entries TEXT NOT NULL, "
               "updated_at DOUBLE PRECISION NOT NULL)")
_LAZY_SQLITE_TRIGGER = ("CREATE TRIGGER IF NOT EXISTS voice_lexicons_follow_voice AFTER DELETE ON voices "
                        "BEGIN DELETE FROM voice_lexicons WHERE voice_id = OLD.id; END")
_LAZY_ROW = "INSERT INTO voice_lexicons (voice_id, entries, updated_at) VALUES ({0}, {0}, 0)"
OLD_LEXICON = Lexicon.from_json([{"word": "SQL", "respelling": "sequel"}])
_OLD_ENTRIES = json.dumps(OLD_LEXICON.to_json()["entries"], ensure_ascii=False, separators=(",", ":"))


def _tone(seconds: float, freq: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _sql(url: str, statement: str, args: tuple = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        cursor = db.execute(statement, args)
        return cursor.fetchall() if cursor.description else []


def _together(n: int, work) -> list:
    """Run ``work(i)`` in ``n`` threads released at once; their results (or exceptions), in order."""
    results: list = [None] * n
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - compared by the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


# -- migrations ------------------------------------------------------------------------------------------------------
def test_an_empty_postgres_database_gets_the_schema_once_and_a_newer_one_is_refused(pg_url):
    with VoiceStore(pg_url) as store:
        assert store.list() == [] and store.directory is None
        store.add("ann", (_tone(1.0), SR), "Hello.", CONSENT)
    with VoiceStore(pg_url) as again:  # reopening applies nothing
        assert [r.name for r in again.list()] == ["ann"]
    assert [v for v, in _sql(pg_url, "SELECT version FROM schema_version ORDER BY version")] == [4, 5]
    assert SCHEMA_VERSION == 5
    tables = {t for t, in _sql(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert tables == {"schema_version", "voices", "voice_features", "prompt_cache", "audit", "blocked_audio",
                      "voice_lexicons"}
    _sql(pg_url, "INSERT INTO schema_version VALUES (%s, 0, 'from the future')", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNewError, match=f"schema {SCHEMA_VERSION + 1}, newer than this Cadenza's "
                                                f"{SCHEMA_VERSION}: upgrade Cadenza"):
        VoiceStore(pg_url)


def test_a_newer_sqlite_store_is_refused(tmp_path):
    VoiceStore(tmp_path).close()
    with sqlite3.connect(tmp_path / "voices.sqlite3") as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaTooNewError, match=f"voices.sqlite3 has schema {SCHEMA_VERSION + 1}, newer"):
        VoiceStore(tmp_path)


def test_replicas_starting_together_on_an_empty_database_migrate_it_once(pg_url):
    stores = _together(4, lambda i: VoiceStore(pg_url))
    assert all(isinstance(s, VoiceStore) for s in stores), stores
    assert _sql(pg_url, "SELECT version FROM schema_version ORDER BY version") == [(4,), (5,)]
    stores[0].add("bo", (_tone(1.0), SR), None, CONSENT)
    assert [[r.name for r in s.list()] for s in stores] == [["bo"]] * 4
    for s in stores:
        s.close()


def test_a_schema_3_sqlite_store_gains_the_consent_record_and_the_audit_log(tmp_path):
    """The previous schema: no consent-record columns, no audit tables, no pinned features."""
    with VoiceStore(tmp_path) as s:
        old = s.add("old", (_tone(1.5), SR), "Hello.", CONSENT)
    with sqlite3.connect(tmp_path / "voices.sqlite3") as db:  # what a Cadenza of schema 3 wrote
        for trigger in ("audit_append_only_update", "audit_append_only_delete"):
            db.execute(f"DROP TRIGGER {trigger}")
        for table in ("audit", "blocked_audio", "voice_features"):
            db.execute(f"DROP TABLE {table}")
        for column in ("declared_by", "audio_sha256", "uses", "last_used_at", "audio_expires_at"):
            db.execute(f"ALTER TABLE voices DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 3")
    with VoiceStore(tmp_path) as s:
        assert s.get("old") == old  # the recording's hash is computed from the stored samples
        assert s.consent_record("old")["uses"] == 0
        s.takedown("old", "migrated, then taken down")
        with pytest.raises(InputError, match="taken down"):
            s.add("again", (_tone(1.5), SR), None, CONSENT)
        assert [e.event for e in s.audit_log()] == ["takedown", "blocked_attempt"]
    with sqlite3.connect(tmp_path / "voices.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def _lexicons_work_after_migrating(store: VoiceStore, rows, old_lexicon: Lexicon | None) -> None:
    """The migrated store: the old voice's lexicon as it was, new ones saved, and deleted with their voices.
    ``rows()``: the ``voice_lexicons`` rows (voice ids), read over a connection of their own."""
    lexicons = VoiceLexicons(store)
    old = store.get("old")
    found = lexicons.lexicon_of("old")
    assert (found and found.entries) == (old_lexicon and old_lexicon.entries)
    new = store.add("new", (_tone(1.0, 330.0), SR), None, CONSENT)
    lexicons.put("new", LEXICON)
    lexicons.put("old", LEXICON)  # replaces the old one (or saves the first)
    assert lexicons.get("new").entries == lexicons.get(old.id).entries == LEXICON.entries
    assert sorted(rows()) == sorted([old.id, new.id])
    store.delete(old.id)
    assert rows() == [new.id]
    store.takedown("new", "migrated, then taken down")
    assert rows() == []


@pytest.mark.parametrize("lazily_created", [False, True], ids=["no-lexicon-table", "lazy-lexicon-table"])
def test_a_schema_4_postgres_database_gains_voice_lexicons(pg_url, lazily_created):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as db:
        assert migrate_postgres(db, "test", target=4) == 0  # exactly what a Cadenza of schema 4 made
    old_id = "voice_" + "o" * 22
    _sql(pg_url, "INSERT INTO voices (id, name, name_key, consent, consent_at, created_at, sample_rate, num_samples, "
                 "audio) VALUES (%s, 'old', 'old', %s, 0, 0, 16000, 16000, '')", (old_id, CONSENT))
    if lazily_created:
        _sql(pg_url, _LAZY_TABLE.format(fk=" REFERENCES voices (id) ON DELETE CASCADE"))
        _sql(pg_url, _LAZY_ROW.format("%s"), (old_id, _OLD_ENTRIES))
    with VoiceStore(pg_url) as store:  # one transaction, under the advisory lock, like every step
        versions = _sql(pg_url, "SELECT version, description FROM schema_version ORDER BY version")
        assert [v for v, _ in versions] == [4, 5] and versions[1][1] == "voice pronunciation lexicons"
        _lexicons_work_after_migrating(store, lambda: [v for v, in _sql(pg_url, "SELECT voice_id FROM voice_lexicons")],
            OLD_LEXICON if lazily_created else None)
    with VoiceStore(pg_url):  # reopening applies nothing
        assert len(_sql(pg_url, "SELECT version FROM schema_version")) == 2


@pytest.mark.parametrize("lazily_created", [False, True], ids=["no-lexicon-table", "lazy-lexicon-table"])
def test_a_schema_4_sqlite_store_gains_voice_lexicons(tmp_path, lazily_created):
    with VoiceStore(tmp_path) as s:
        old = s.add("old", (_tone(1.0), SR), "Hello.", CONSENT)
    path = tmp_path / "voices.sqlite3"
    with sqlite3.connect(path) as db:  # what a Cadenza of schema 4 wrote
        db.execute("DROP TRIGGER voice_lexicons_follow_voice")
        db.execute("DROP TABLE voice_lexicons")
        db.execute("PRAGMA user_version = 4")
        if lazily_created:
            db.execute(_LAZY_TABLE.format(fk=""))
            db.execute(_LAZY_SQLITE_TRIGGER)
            db.execute(_LAZY_ROW.format("?"), (old.id, _OLD_ENTRIES))
    db.close()

    def rows() -> list[str]:
        with sqlite3.connect(path) as db:
            found = [v for v, in db.execute("SELECT voice_id FROM voice_lexicons")]
        db.close()
        return found

    with VoiceStore(tmp_path) as store:
        assert store.get("old") == old
        _lexicons_work_after_migrating(store, rows, OLD_LEXICON if lazily_created else None)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'voices'"
                          ).fetchall() == [("voice_lexicons_follow_voice",)]
    db.close()


# -- several stores on one database ----------------------------------------------------------------------------------
def test_two_stores_on_one_database_see_each_others_writes_and_deletes(pg_url):
    with VoiceStore(pg_url) as a, VoiceStore(pg_url) as b:
        rec = a.add("cleo", (_tone(1.0), SR), "Hello.", CONSENT, declared_by="Cleo", keep_audio=True)
        assert b.get("CLEO") == rec and [r.id for r in b.list()] == [rec.id]
        np.testing.assert_allclose(b.audio(rec.id)[0], _tone(1.0), atol=1.0 / 32767)
        b.cache_prompt(rec.id, "cv2-k", {"x": torch.arange(4.0)})  # computed by one replica, used by the other
        assert torch.equal(a.cached_prompt(rec.id, "cv2-k")["x"], torch.arange(4.0))
        b.record_use(rec.id)
        assert a.consent_record(rec.id)["uses"] == 1
        with pytest.raises(InputError, match="already exists"):
            b.add("Cleo", (_tone(1.0, 330.0), SR), None, CONSENT)
        a.delete(rec.id)
        assert rec.id not in b and b.list() == [] and b.cached_prompt(rec.id, "cv2-k") is None
        with pytest.raises(UnknownSpeakerError):
            b.cache_prompt(rec.id, "cv2-k", {"x": torch.arange(4.0)})
        assert _sql(pg_url, "SELECT count(*) FROM voices") == [(0,)]
        assert _sql(pg_url, "SELECT count(*) FROM prompt_cache") == [(0,)]
        dee = b.add("dee", (_tone(1.0, 440.0), SR), None, CONSENT)
        b.takedown("dee", "asked by email")
        with pytest.raises(InputError, match="taken down"):
            a.add("dee2", (_tone(1.0, 440.0), SR), None, CONSENT)
        assert [(e.event, e.voice_id) for e in a.audit_log()][-3:] == [("created", dee.id), ("takedown", dee.id),
                                                                       ("blocked_attempt", None)]


def test_concurrent_writers_one_name_one_winner_one_delete_one_event(pg_url):
    stores = [VoiceStore(pg_url) for _ in range(5)]  # five replicas' connections
    try:
        results = _together(5, lambda i: stores[i].add("contested", (_tone(1.0, 200.0 + 50 * i), SR), None, CONSENT))
        won = [r for r in results if not isinstance(r, Exception)]
        lost = [r for r in results if isinstance(r, Exception)]
        assert len(won) == 1 and len(lost) == 4, results
        assert all(isinstance(e, InputError) and "already exists" in str(e) for e in lost)
        assert [r.id for r in stores[3].list()] == [won[0].id]
        deletes = _together(5, lambda i: stores[i].delete(won[0].id))
        assert sum(d is None for d in deletes) == 1
        assert all(isinstance(d, UnknownSpeakerError) for d in deletes if d is not None)
        assert [e.event for e in stores[0].audit_log(won[0].id)] == ["created", "deleted"]
        # Many writers, distinct names: every voice saved, once.
        made = _together(5, lambda i: [stores[i].add(f"w{i}-{k}", (_tone(0.6), SR), None, CONSENT).id for k in range(3)])
        assert sorted(r.id for r in stores[0].list()) == sorted(v for ids in made for v in ids)
    finally:
        for s in stores:
            s.close()


def test_expired_recordings_are_dropped_once_across_replicas(pg_url):
    import time

    with VoiceStore(pg_url) as a, VoiceStore(pg_url) as b:
        rec = a.add("eve", (_tone(1.0), SR), None, CONSENT, keep_audio=True, audio_ttl_s=0.3,
                    features={"cv2-k": {"x": torch.ones(2)}})
        time.sleep(0.4)
        assert sorted(_together(2, lambda i: (a, b)[i].drop_expired_audio())) == [0, 1]
        assert not b.get("eve").audio_kept and torch.equal(b.cached_prompt(rec.id, "cv2-k")["x"], torch.ones(2))
        assert [e.event for e in a.audit_log(rec.id)] == ["created", "audio_expired"]
        assert _sql(pg_url, "SELECT length(audio) FROM voices") == [(0,)]


def test_a_lost_connection_is_replaced_and_an_unreachable_database_is_a_clear_error(pg_url, postgres_server):
    dbname = pg_url.rsplit("/", 1)[1]
    with VoiceStore(pg_url) as store:
        rec = store.add("fay", (_tone(1.0), SR), None, CONSENT)
        kill = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
        assert _sql(postgres_server.url(), kill) == [(True,)]
        assert store.get("fay") == rec  # a read on the dead connection is retried once on a new one
        _sql(postgres_server.url(), f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
        _sql(postgres_server.url(), kill)
        with pytest.raises(VoiceStoreUnavailableError, match="cannot be reached") as err:
            store.list()
        assert postgres_server.password not in str(err.value)
        _sql(postgres_server.url(), f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
        assert store.list() == [rec]  # back as soon as the database is
    with pytest.raises(InputError, match=r"cannot open the voice store postgresql://127\.0\.0\.1:1/nowhere") as err:
        VoiceStore(f"postgresql://postgres:{postgres_server.password}@127.0.0.1:1/nowhere", busy_timeout_s=2)
    assert postgres_server.password not in str(err.value)
    assert postgres_server.password not in VoiceStore(pg_url).location
    with pytest.raises(InputError, match="bad voice database URL") as err:  # libpq quotes the URL it cannot parse
        VoiceStore("postgresql://cadenza:hunter2-secret@[::1/voices")
    assert "hunter2-secret" not in str(err.value) and "cadenza:***@" in str(err.value)


def test_the_audit_log_refuses_edits_on_postgres(pg_url):
    import psycopg

    with VoiceStore(pg_url) as store:
        store.add("gil", (_tone(1.0), SR), None, CONSENT)
    for statement in ("DELETE FROM audit", "UPDATE audit SET event = 'deleted'", "TRUNCATE audit"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            _sql(pg_url, statement)
    assert _sql(pg_url, "SELECT event FROM audit") == [("created",)]


def test_voices_cli_on_postgres(pg_url, capsys, monkeypatch, tmp_path):
    from cadenza.cli.main import main

    with VoiceStore(pg_url) as store:
        rec = store.add("hal", (_tone(1.0), SR), None, CONSENT, declared_by="Hal")
    assert main(["voices", "--voices-db", pg_url, "list"]) == 0
    assert f'"id": "{rec.id}"' in capsys.readouterr().out
    monkeypatch.setenv("CADENZA_VOICES_DB", pg_url)  # the variable, as `cadenza serve` reads it
    assert main(["voices", "list"]) == 0 and f'"id": "{rec.id}"' in capsys.readouterr().out
    assert main(["voices", "--voices-dir", str(tmp_path), "list"]) != 0  # a flag wins over the variable
    assert "no voice store in" in capsys.readouterr().err
    assert main(["voices", "--voices-db", pg_url, "takedown", "hal", "--reason", "by letter"]) == 0
    assert main(["voices", "--voices-db", pg_url, "audit"]) == 0
    out = capsys.readouterr().out
    assert '"event": "takedown"' in out and "by letter" in out
    assert main(["voices", "--voices-db", "mysql://x", "list"]) != 0
    assert "--voices-db takes a postgresql://" in capsys.readouterr().err
    assert main(["voices", "--voices-db", pg_url, "--voices-dir", str(Path.cwd()), "list"]) != 0
    assert "not both" in capsys.readouterr().err


# -- two live servers on one database --------------------------------------------------------------------------------
def test_two_servers_on_one_database_share_voices(cv2_dir, tmp_path, pg_url, postgres_server):
    """Two server apps on loopback (each its own voice store, connection and prompt library: two replicas behind a
    load balancer; one model object serves both, to save loading it twice), one PostgreSQL database."""
    import httpx

    from cadenza import Cadenza
    from cadenza.server import ServerConfig, create_app

    from test_server_harness import CONSENT as SPEAKER_CONSENT
    from test_server_harness import LiveServer, tone, wav_bytes
    from toy_model import build_toy_model_dir

    key, admin = "replica-key-0123456789", "replica-admin-0123456789"
    auth, admin_auth = {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {admin}"}
    model_dir = build_toy_model_dir(cv2_dir, tmp_path / "model")

    def create(c: httpx.Client, name: str, freq: float = 220.0) -> httpx.Response:
        return c.post("/v1/audio/voices", headers=auth, files={"audio": ("v.wav", wav_bytes(tone(1.5, freq=freq)))},
                      data={"name": name, "consent": SPEAKER_CONSENT, "transcript": "Just by listening."})

    def speak(c: httpx.Client, voice: str) -> httpx.Response:
        return c.post("/v1/audio/speech", headers=auth, json={"model": "tts-1", "input": "Hello there.",
                                                              "voice": voice, "seed": 3, "response_format": "pcm"})

    config = ServerConfig(api_key=key, admin_key=admin)
    with Cadenza.from_pretrained(model_dir) as tts, VoiceStore(pg_url) as store_a, VoiceStore(pg_url) as store_b:
        app_a, app_b = create_app(tts, store_a, config), create_app(tts, store_b, config)
        with (LiveServer(app_a) as server_a, LiveServer(app_b) as server_b,
              httpx.Client(base_url=server_a.url, timeout=120) as a, httpx.Client(base_url=server_b.url, timeout=120) as b):
            assert a.get("/health").json()["status"] == "ok" and b.get("/health").json()["status"] == "ok"
            ivy = create(a, "ivy")
            assert ivy.status_code == 201, ivy.text
            ivy = ivy.json()
            assert b.get("/v1/audio/voices", headers=auth).json() == [{"id": ivy["id"], "name": "ivy",
                                                                       "family": "cosyvoice2"}]
            assert b.get("/v1/audio/voices/IVY", headers=auth).json() == ivy
            said_a, said_b = speak(a, "ivy"), speak(b, "ivy")  # B's library reads the features A pinned
            assert said_a.status_code == said_b.status_code == 200 and len(said_a.content) > 4800
            assert said_a.content == said_b.content
            assert b.get(f"/v1/audio/voices/{ivy['id']}/consent", headers=auth).json()["uses"] == 2
            # The same new name on both at once: one is created, the other told the name is taken.
            both = _together(2, lambda i: create((a, b)[i], "jun", freq=300.0 + 40 * i))
            assert sorted(r.status_code for r in both) == [201, 400], [r.text for r in both]
            lost = next(r for r in both if r.status_code == 400).json()["error"]
            assert "already exists" in lost["message"] and lost["param"] == "name"
            # Deleted on B: unknown on A at once, and A's model drops what it remembered of the voice.
            prompts_a = app_a.state.cadenza.default.prompts
            prompts_a.forget_check_s = 0.0
            assert ivy["id"] in prompts_a._memory
            assert b.delete(f"/v1/audio/voices/{ivy['id']}", headers=auth).status_code == 200
            assert a.get(f"/v1/audio/voices/{ivy['id']}", headers=auth).status_code == 404
            gone = speak(a, "ivy")
            assert gone.status_code == 400 and gone.json()["error"]["code"] == "voice_not_found"
            assert ivy["id"] not in prompts_a._memory
            # A takedown through A's admin endpoint: B refuses the same recording from then on.
            down = a.post("/v1/admin/voices/jun/takedown", headers=admin_auth, json={"reason": "complaint"})
            assert down.status_code == 200, down.text
            taken = [r for r in both if r.status_code == 201][0].json()
            freq = 300.0 + 40 * both.index(next(r for r in both if r.status_code == 201))
            again = create(b, "jun2", freq=freq)
            assert again.status_code == 400 and "taken down" in again.json()["error"]["message"]
            events = [(e["event"], e["voice_id"]) for e in b.get("/v1/admin/audit", headers=admin_auth).json()["data"]]
            assert events[-3:] == [("deleted", ivy["id"]), ("takedown", taken["id"]), ("blocked_attempt", None)]
            # The database unreachable: voice requests answer 503 + Retry-After (try another replica), /health stays
            # up (synthesis with the model's own voices needs no database), and it all comes back with the database.
            dbname = pg_url.rsplit("/", 1)[1]
            _sql(postgres_server.url(), f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
            _sql(postgres_server.url(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                        f"WHERE datname = '{dbname}'")
            down = b.get("/v1/audio/voices", headers=auth)
            assert down.status_code == 503 and down.headers["Retry-After"]
            assert down.json()["error"]["code"] == "voice_store_unavailable"
            assert postgres_server.password not in down.text and b.get("/health").status_code == 200
            _sql(postgres_server.url(), f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
            assert b.get("/v1/audio/voices", headers=auth).status_code == 200
            assert "cadenza_requests_total" in b.get("/metrics", headers=auth).text


# -- what docs/server.md#deployment says about roles and deleting ---------------------------------------------------
def _documented_grants() -> str:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    section = docs[docs.index("## Deployment"):]
    return section[section.index("```sql") + len("```sql"):section.index("```", section.index("```sql") + 6)]


def test_replicas_run_with_the_documented_grants_and_cannot_rewrite_the_audit_log(pg_url, postgres_server):
    import psycopg

    role = f"cadenza_server_{pg_url.rsplit('_', 1)[1]}"  # roles belong to the whole cluster: one per test database
    _sql(pg_url, f"CREATE ROLE {role} LOGIN PASSWORD 'replica-password'")
    try:
        url = pg_url.replace(f"postgres:{postgres_server.password}@", f"{role}:replica-password@")
        with pytest.raises(InputError, match="cannot set up the voice database .*permission denied"):
            VoiceStore(url)  # it may not create the tables
        VoiceStore(pg_url).close()  # the owner (here the superuser) does
        _sql(pg_url, _documented_grants().replace("cadenza_server", role))
        with VoiceStore(url) as store:  # every operation a replica makes
            rec = store.add("ida", (_tone(1.0), SR), "Hello.", CONSENT, keep_audio=True, audio_ttl_s=3600)
            store.cache_prompt(rec.id, "cv2-k", {"x": torch.ones(3)})
            store.cache_prompt(rec.id, "cv2-k", {"x": torch.zeros(3)})  # an update of the cached row
            lexicons = VoiceLexicons(store)
            lexicons.put("ida", Lexicon.from_json([{"word": "x", "respelling": "y"}]))
            lexicons.put("ida", LEXICON)  # an update of the lexicon's row
            assert lexicons.get("ida").entries == LEXICON.entries and lexicons.clear("ida") and lexicons.lexicon_of("ida") is None
            lexicons.put("ida", LEXICON)  # deleted with the voice by the takedown below
            assert torch.equal(store.cached_prompt(rec.id, "cv2-k")["x"], torch.zeros(3))
            store.record_use(rec.id)
            assert store.consent_record("ida")["uses"] == 1 and store.drop_expired_audio() == 0
            other = store.add("jo", (_tone(1.0, 500.0), SR), None, CONSENT)
            store.delete(other.id)
            store.takedown("ida", "test")
            assert store.list() == [] and [e.event for e in store.audit_log()][-1] == "takedown"
            assert _sql(pg_url, "SELECT count(*) FROM voice_lexicons") == [(0,)]
        with psycopg.connect(url, autocommit=True) as db:
            for statement in ("DELETE FROM audit", "UPDATE audit SET event = 'x'", "TRUNCATE audit",
                              "DROP TRIGGER audit_append_only ON audit", "ALTER TABLE audit DISABLE TRIGGER ALL",
                              "DELETE FROM blocked_audio", "DROP TABLE voices"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    db.execute(statement)
    finally:
        _sql(pg_url, f"DROP OWNED BY {role}")
        _sql(pg_url, f"DROP ROLE {role}")


def test_a_deleted_recording_leaves_the_table_files_only_with_vacuum_full(pg_url, postgres_server):
    """What docs/server.md#deployment says: PostgreSQL has no secure_delete; VACUUM FULL rewrites the files."""
    rng = np.random.default_rng(1)
    samples = (_tone(2.0) + 0.05 * rng.standard_normal(2 * SR)).astype(np.float32)  # noise: stored uncompressed
    needle = np.round(np.clip(samples, -1, 1) * 32767).astype("<i2")[8000:8016].tobytes()
    dboid = _sql(pg_url, "SELECT oid FROM pg_database WHERE datname = current_database()")[0][0]
    folder = postgres_server.data_dir / "base" / str(dboid)

    def files_holding() -> list[str]:
        _sql(pg_url, "CHECKPOINT")  # (as superuser) every change is in the files now
        return [p.name for p in folder.iterdir() if p.is_file() and needle in p.read_bytes()]

    with VoiceStore(pg_url) as store:
        rec = store.add("kit", (samples, SR), None, CONSENT, keep_audio=True)
        assert files_holding(), "the kept recording is in the table's files"
        store.delete(rec.id)
        assert rec.id not in store
        assert files_holding(), "DELETE alone leaves the bytes in the files (no secure_delete)"
        _sql(pg_url, "VACUUM FULL voices, voice_features, prompt_cache")
        assert files_holding() == []
