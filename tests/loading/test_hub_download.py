"""Models by hub name (``cadenza.loading.hub``) against a live HTTP server on loopback that answers the way the Hugging
Face Hub's endpoints do, with ``HF_ENDPOINT`` pointed at it, so the real ``huggingface_hub`` client code runs:
model info, the file tree, HEAD and ranged GET of ``/resolve/``. The repositories it serves are the parity fixture
folders (plus decoy files a family never reads)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import pytest

pytest.importorskip("huggingface_hub", reason="the 'hub' extra (huggingface_hub) is not installed")
from huggingface_hub import constants as hf_constants  # noqa: E402

import cadenza  # noqa: E402
from cadenza import Cadenza  # noqa: E402
from cadenza.api import VoxCPM2  # noqa: E402
from cadenza.errors import CheckpointError, InputError, MissingDependencyError  # noqa: E402
from cadenza.loading.hub import folder_name, locate_model, parse_hub_name  # noqa: E402

CV2_FILES = {"config.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/config.json"}
VX2_FILES = {"config.json", "model.safetensors", "audiovae.pth", "tokenizer.json", "tokenizer_config.json"}
TEXT_IDS = [5, 17, 42, 99, 3, 250, 7]


@dataclass
class Commit:
    sha: str
    files: dict[str, Path]  # path in the repository -> the file served
    refs: tuple[str, ...]


@dataclass
class FakeHub:
    """The repositories served, what was asked for, and the faults to inject."""

    repos: dict[str, list[Commit]] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range header)
    drop_once: dict[str, float] = field(default_factory=dict)  # file -> fraction sent before the connection drops
    fail_ranges: set[str] = field(default_factory=set)  # files whose ranged GETs get HTTP 500
    url: str = ""

    def add(self, repo_id: str, files: dict[str, Path], refs: tuple[str, ...] = ("main",)) -> str:
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + _git_oid(files[name]).encode())
        sha = digest.hexdigest()
        self.repos.setdefault(repo_id, []).append(Commit(sha, dict(files), refs))
        return sha

    def commit(self, repo_id: str, revision: str) -> Commit | None:
        for c in self.repos.get(repo_id, ()):
            if revision == c.sha or revision in c.refs:
                return c
        return None

    def gets(self, name: str) -> list[str | None]:
        """The Range headers of the GETs of file ``name`` (None: the whole file)."""
        return [r for m, p, r in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name)]

    def file_requests(self) -> list[str]:
        return [p for m, p, _ in self.requests if "/resolve/" in p]


def _git_oid(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, doc) -> None:
            self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": code, "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(status, json.dumps({"error": code}).encode(), headers)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            url = urlsplit(self.path)
            path = unquote(url.path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:3] == ["api", "v1", "models"] and len(parts) >= 6:
                return self._modelscope("/".join(parts[3:5]), "/".join(parts[5:]), parse_qs(url.query))
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo_id, rev = "/".join(parts[2:4]), "/".join(parts[5:])
                if repo_id not in hub.repos:
                    return self._error(404, "RepoNotFound")
                commit = hub.commit(repo_id, rev)
                if commit is None:
                    return self._error(404, "RevisionNotFound")
                if parts[4] == "revision":
                    return self._json({"id": repo_id, "modelId": repo_id, "sha": commit.sha, "private": False,
                                       "siblings": [{"rfilename": n} for n in sorted(commit.files)]})
                folders = sorted({n.rsplit("/", 1)[0] for n in commit.files if "/" in n})
                return self._json([{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in folders]
                                  + [{"type": "file", "oid": _git_oid(p), "size": p.stat().st_size, "path": n}
                                     for n, p in sorted(commit.files.items())])
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                commit = hub.commit(repo_id, rev)
                if commit is None:
                    return self._error(404, "RepoNotFound" if repo_id not in hub.repos else "RevisionNotFound")
                if name not in commit.files:
                    return self._error(404, "EntryNotFound", commit.sha)
                return self._file(commit, name)
            self._error(404, "NotFound")

        def _modelscope(self, repo_id: str, route: str, query: dict) -> None:
            """ModelScope's two routes its client downloads through: the file list and one file."""
            commit = hub.commit(repo_id, query.get("Revision", ["master"])[0])
            if commit is None:
                return self._send(404, json.dumps({"Code": 404, "Message": "model not found"}).encode(),
                                  {"Content-Type": "application/json"})
            if route == "repo/files":
                entries = [{"Path": n, "Name": n.rsplit("/", 1)[-1], "Type": "blob", "Size": p.stat().st_size,
                            "Sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "Revision": commit.sha}
                           for n, p in sorted(commit.files.items())]
                return self._json({"Code": 200, "Success": True, "Data": {"Files": entries}})
            name = query.get("FilePath", [""])[0]
            if route == "repo" and name in commit.files:
                hub.requests.append(("GET", f"/modelscope/{repo_id}/{name}", None))
                return self._send(200, commit.files[name].read_bytes(), {"Content-Type": "application/octet-stream"})
            self._send(404, b'{"Code": 404}', {"Content-Type": "application/json"})

        def _file(self, commit: Commit, name: str) -> None:
            data = commit.files[name].read_bytes()
            headers = {"ETag": f'"{_git_oid(commit.files[name])}"', "X-Repo-Commit": commit.sha,
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            start, status = 0, 200
            ranged = self.headers.get("Range")
            if self.command == "GET" and ranged:
                if name in hub.fail_ranges:
                    return self._error(500, "InternalError")
                start = int(ranged.removeprefix("bytes=").split("-")[0])
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            fraction = hub.drop_once.pop(name, None) if self.command == "GET" and not ranged else None
            if fraction is None:
                return self._send(status, body, headers)
            # Promise the whole file, send part of it, then drop the connection.
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:int(len(body) * fraction)])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    return Handler


def _set_hub_env(env: dict[str, str | None]) -> None:
    """Set the variables huggingface_hub reads at import and make it read them again (as a new process would)."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    importlib.reload(hf_constants)


@pytest.fixture
def hub(tmp_path):
    """A live fake hub on loopback; HF_ENDPOINT points at it and the cache is under tmp_path."""
    state = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    names = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN",
             "HF_HUB_DISABLE_PROGRESS_BARS")
    saved = {k: os.environ.get(k) for k in names}
    _set_hub_env({"HF_ENDPOINT": state.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": None,
                  "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_TOKEN": None,
                  "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        _set_hub_env(saved)


def _folder(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, Path]:
    return {p.relative_to(directory).as_posix(): p for p in sorted(directory.rglob("*"))
            if p.is_file() and p.relative_to(directory).as_posix() not in skip}


def _snapshot_files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def _cv2_repo(cv2_dir: Path) -> dict[str, Path]:
    """The fixture folder as a repository, with a decoy where the release keeps Qwen's unused weights."""
    return {**_folder(cv2_dir), "CosyVoice-BlankEN/model.safetensors": cv2_dir / "tts_cases.npz"}


def test_cosyvoice2_by_name_downloads_only_its_files_and_speaks_as_the_folder(hub, cv2_dir):
    sha = hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir))
    tts = Cadenza.from_pretrained("hubtest/cosyvoice2")
    assert tts.directory.name == sha and tts.directory.parent.name == "snapshots"
    assert _snapshot_files(tts.directory) == CV2_FILES  # not the npz cases, README, decoy weights
    fetched = {p.rsplit("/resolve/", 1)[1].split("/", 1)[1] for p in hub.file_requests()}
    assert fetched == CV2_FILES
    for name in CV2_FILES:
        assert (tts.directory / name).read_bytes() == (cv2_dir / name).read_bytes()
    by_name = tts.synthesize(text_ids=TEXT_IDS, seed=3)
    local = Cadenza.from_pretrained(cv2_dir).synthesize(text_ids=TEXT_IDS, seed=3)
    # Same weights and the same model id in the watermark (the repository's name, as the local folder's).
    assert folder_name(tts.directory) == "cosyvoice2" and by_name.sample_rate == 24000
    np.testing.assert_array_equal(by_name.samples, local.samples)


def test_voxcpm2_by_name_speaks_and_comes_from_the_cache_next_time(hub, vx2_model_dir):
    decoys = {"pytorch_model.bin": vx2_model_dir / "model.safetensors", "README.md": vx2_model_dir / "config.json"}
    hub.add("openbmb/tiny_model", {**_folder(vx2_model_dir), **decoys})
    with VoxCPM2.from_pretrained("openbmb/tiny_model") as tts:
        assert tts.family == "voxcpm2" and _snapshot_files(tts.directory) == VX2_FILES
        audio = tts.synthesize("Hello there.", seed=1)
        assert audio.sample_rate == 48000 and len(audio.samples) > 4800 and np.isfinite(audio.samples).all()
        assert float(np.abs(audio.samples).max()) > 1e-3
    assert hub.gets("pytorch_model.bin") == [] and hub.gets("special_tokens_map.json") == []
    before = len(hub.requests)
    assert locate_model("openbmb/tiny_model") == tts.directory  # cached: no file is fetched again
    assert [p for m, p, _ in hub.requests[before:] if m == "GET" and "/resolve/" in p] == []


def test_cli_by_name_then_offline_from_the_cache(hub, cv2_dir, tmp_path, monkeypatch, capsys):
    from cadenza.cli.main import main as cli_main

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # no default voice store
    monkeypatch.delenv("CADENZA_VOICES_DIR", raising=False)
    hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir))
    expected = Cadenza.from_pretrained(cv2_dir).synthesize(text_ids=TEXT_IDS, seed=2).samples
    argv = ["synth", "--model", "hubtest/cosyvoice2", "--revision", "main", "--text-ids", ",".join(map(str, TEXT_IDS)),
            "--seed", "2", "--dtype", "float32", "-o"]
    assert cli_main(argv + [str(tmp_path / "online.wav")]) == 0, capsys.readouterr().err
    fetched = len(hub.requests)
    # Offline, and the endpoint's address dead: the cache answers (huggingface_hub reads both at import, so they
    # are set and its constants read again, as a new process would; the serve test below is a new process).
    _set_hub_env({"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert cli_main(argv + [str(tmp_path / "offline.wav")]) == 0, capsys.readouterr().err
    assert len(hub.requests) == fetched
    import soundfile as sf

    for name in ("online.wav", "offline.wav"):
        samples, sr = sf.read(tmp_path / name, dtype="float32")
        assert sr == 24000 and samples.shape == expected.shape
        np.testing.assert_allclose(samples, expected, atol=1 / 32767)  # the WAV is 16-bit
    capsys.readouterr()
    assert cli_main(["synth", "--model", "hubtest/other", "--text-ids", "5", "-o", str(tmp_path / "x.wav")]) == 2
    err = capsys.readouterr().err
    assert "model hubtest/other is not in the cache" in err and "OfflineModeIsEnabled" in err
    assert "Traceback" not in err


def test_cadenza_serve_offline_serves_a_pinned_name_under_the_repository_name(hub, cv2_dir, tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn", reason="cadenza serve needs the 'server' extra")
    v1 = hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir), refs=("v1",))
    hub.add("hubtest/cosyvoice2", {**_cv2_repo(cv2_dir), "hift.pt": cv2_dir / "hift_legacy_weightnorm_names.pt"})
    assert locate_model("hubtest/cosyvoice2@v1").name == v1  # into the cache; the server below is offline
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A new process reads the variables a user sets: offline, an endpoint nobody answers, the cache's home.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "CADENZA_API_KEY": ""}
    proc = subprocess.Popen([sys.executable, "-m", "cadenza", "serve", "--model", "hubtest/cosyvoice2@v1",
                             "--port", str(port), "--voices-dir", str(tmp_path / "voices"), "--log-level", "warning",
                             "--vocoder-workers", "1", "--threads", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        from test_server_harness import wait_until

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        assert wait_until(up, timeout=90) and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["cosyvoice2"]  # the repository's name, not the snapshot's commit
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"snapshots/{v1}" in err and "as 'cosyvoice2'" in err  # the pinned revision's files


def test_unknown_repository_and_revision_are_clear_errors(hub, cv2_dir):
    hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir))
    with pytest.raises(InputError, match="no model family takes temprature"):
        cadenza.load("hubtest/cosyvoice2", temprature=0.5)
    with pytest.raises(CheckpointError, match=r"no model folder 'hubtest/nothing' here and no Hugging Face repository "
                                              r"'hubtest/nothing' \(http://127"):
        cadenza.load("hubtest/nothing")
    with pytest.raises(CheckpointError, match="repository hubtest/cosyvoice2 has no revision 'v9'"):
        cadenza.load("hubtest/cosyvoice2@v9")
    assert hub.file_requests() == []


def test_interrupted_download_resumes_where_it_stopped(hub, cv2_dir, monkeypatch):
    # The client keeps what it received in 10 MiB pieces; the fixture's files are smaller than one.
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir))
    hub.drop_once["flow.pt"] = 0.5
    folder = locate_model("hubtest/cosyvoice2")
    ranges = hub.gets("flow.pt")
    size = (cv2_dir / "flow.pt").stat().st_size
    assert ranges[0] is None and len(ranges) == 2  # the whole file, then the rest of it
    start = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert size // 4 < start < size  # resumed from where the transfer broke, not from the start
    assert (folder / "flow.pt").read_bytes() == (cv2_dir / "flow.pt").read_bytes()


def test_a_run_that_stops_keeps_finished_files_for_the_next(hub, cv2_dir, monkeypatch):
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir))
    hub.drop_once["hift.pt"] = 0.5
    hub.fail_ranges.add("hift.pt")  # the resume fails too: this run stops
    with pytest.raises(CheckpointError, match="downloading Hugging Face model hubtest/cosyvoice2 stopped: .*run "
                                              "again to resume"):
        cadenza.load("hubtest/cosyvoice2")
    hub.fail_ranges.clear()
    folder = locate_model("hubtest/cosyvoice2")
    assert all(len(hub.gets(n)) == 1 for n in CV2_FILES - {"hift.pt"})  # finished files were not fetched again
    first, resume, again = hub.gets("hift.pt")  # broken off; its resume refused (the run stops); then again
    # (huggingface_hub >= 1.x drops a partial file when its run stops, so the next run fetches it whole)
    assert first is None and resume.startswith("bytes=") and (again is None or again.startswith("bytes="))
    assert (folder / "hift.pt").read_bytes() == (cv2_dir / "hift.pt").read_bytes()


def test_repository_missing_a_required_file_is_refused_naming_it(hub, cv2_dir):
    hub.add("hubtest/incomplete", _folder(cv2_dir, skip=("hift.pt",)))
    with pytest.raises(CheckpointError, match=r"Hugging Face repository hubtest/incomplete is not a model folder Cadenza can load: "
                                              r"CosyVoice 2 needs hift\.pt; VoxCPM 2 needs .*audiovae\.safetensors or "
                                              r"audiovae\.pth"):
        cadenza.load("hubtest/incomplete")
    assert hub.file_requests() == []  # refused before anything was downloaded


def test_revision_pinning_picks_that_revisions_files(hub, cv2_dir):
    files = _cv2_repo(cv2_dir)
    v1 = hub.add("hubtest/cosyvoice2", files, refs=("v1",))
    main = hub.add("hubtest/cosyvoice2", {**files, "hift.pt": cv2_dir / "hift_legacy_weightnorm_names.pt"},
                   refs=("main",))
    latest = cadenza.load("hubtest/cosyvoice2").directory
    pinned = Cadenza.from_pretrained("hubtest/cosyvoice2", revision="v1").directory
    assert (latest.name, pinned.name) == (main, v1)
    assert locate_model("hubtest/cosyvoice2@v1") == locate_model(f"hubtest/cosyvoice2@{v1}") == pinned
    assert (pinned / "hift.pt").read_bytes() == (cv2_dir / "hift.pt").read_bytes()
    assert (latest / "hift.pt").read_bytes() == (cv2_dir / "hift_legacy_weightnorm_names.pt").read_bytes()
    with pytest.raises(InputError, match="names revision 'v1' but revision='main'"):
        cadenza.load("hubtest/cosyvoice2@v1", revision="main")


def test_local_folder_wins_and_revision_needs_a_hub_name(hub, cv2_dir, tmp_path, monkeypatch):
    hub.add("hubtest/cosyvoice2", _cv2_repo(cv2_dir))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hubtest").mkdir()
    (tmp_path / "hubtest" / "cosyvoice2").symlink_to(cv2_dir)
    tts = Cadenza.from_pretrained("hubtest/cosyvoice2")
    assert tts.directory == Path("hubtest/cosyvoice2") and hub.requests == []
    with pytest.raises(InputError, match="revision applies to hub model names; 'hubtest/cosyvoice2' is a local"):
        cadenza.load("hubtest/cosyvoice2", revision="v1")
    with pytest.raises(InputError, match="not a Hugging Face model name"):
        cadenza.load("hf:hubtest/../x")


def test_modelscope_name_through_its_client(hub, vx2_model_dir, cv2_dir, tmp_path, monkeypatch):
    pytest.importorskip("modelscope", reason="the 'modelscope' extra is not installed")
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    hub.add("openbmb/tiny_model", {**_folder(vx2_model_dir), "pytorch_model.bin": vx2_model_dir / "model.safetensors"},
            refs=("master",))
    hub.add("iic/incomplete", _folder(cv2_dir, skip=("flow.pt",)), refs=("master",))
    folder = locate_model("modelscope:openbmb/tiny_model")
    assert folder.is_relative_to(tmp_path / "modelscope") and folder_name(folder) == "tiny_model"
    assert _snapshot_files(folder) == VX2_FILES
    assert {p.rsplit("/", 1)[1] for m, p, _ in hub.requests if p.startswith("/modelscope/")} == VX2_FILES
    for name in VX2_FILES:
        assert (folder / name).read_bytes() == (vx2_model_dir / name).read_bytes()
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://127.0.0.1:9")  # unreachable: the cached copy is used
    assert locate_model("modelscope:openbmb/tiny_model") == folder
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    with pytest.raises(CheckpointError, match=r"ModelScope repository iic/incomplete is not a model folder Cadenza "
                                              r"can load: CosyVoice 2 needs flow\.pt"):
        cadenza.load("modelscope:iic/incomplete")
    with pytest.raises(CheckpointError, match=r"ModelScope model iic/nothing: .*not found.*not in ModelScope's cache"):
        cadenza.load("modelscope:iic/nothing")


def test_names_and_missing_extras(monkeypatch, tmp_path):
    assert parse_hub_name("FunAudioLLM/CosyVoice2-0.5B@v2.0").revision == "v2.0"
    assert parse_hub_name("modelscope:iic/CosyVoice2-0.5B").hub == "modelscope"
    for path in ("/abs/dir", "./a/b", "a/b/c", "~/a/b", "cadenza-tiny", "a--b/c", "a/b@.."):
        assert parse_hub_name(path) is None, path
    assert folder_name(tmp_path / "models--openbmb--VoxCPM2" / "snapshots" / ("0" * 40)) == "VoxCPM2"
    assert folder_name(tmp_path / "models" / "iic--CosyVoice2-0.5B" / "snapshots" / "master") == "CosyVoice2-0.5B"
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if the extra were not installed
    with pytest.raises(MissingDependencyError, match=r"needs the 'hub' extra .*pip install 'cadenza\[hub\]'"):
        cadenza.load("hubtest/not-here")
    monkeypatch.setitem(sys.modules, "modelscope", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'cadenza\[modelscope\]'"):
        cadenza.load("modelscope:hubtest/not-here")
