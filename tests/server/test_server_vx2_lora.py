"""Per-request LoRA adapters through the server (real uvicorn on 127.0.0.1): a tiny VoxCPM 2 model with two adapters
registered as ``cadenza serve --lora`` does, beside a CosyVoice 2 model.

Requests pick an adapter by ``model: "vx2:<name>"`` or the ``lora`` field; requests with two adapters and none,
sent at once and batched in one scheduler step, give what each gives alone; unknown adapters are 404 listing the
registered ones; the CosyVoice 2 model refuses the field; the admin upload endpoint checks its key, the name, the
files' sizes and contents.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from cadenza import Cadenza, VoxCPM2
from cadenza.cli.serve import register_loras
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.errors import CadenzaError
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore
from vx2_lora_helpers import make_adapter

from test_server_harness import LiveServer
from toy_model import build_toy_model_dir

KEY = "test-key-0123456789"
ADMIN = "admin-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
TEXT = "Hello there, how are you today?"
MAX_LORA_BYTES = 64 * 1024  # the fixture adapter (52 KB) fits, a bigger file does not


@pytest.fixture(scope="module")
def folders(vx2_model_dir, tmp_path_factory) -> dict:
    return {"a": vx2_model_dir.parent / "tiny_lora",
            "b": make_adapter(vx2_model_dir, tmp_path_factory.mktemp("lora") / "b")}


@pytest.fixture(scope="module")
def live(vx2_model_dir, cv2_dir, folders, tmp_path_factory):
    # One worker: requests in flight together share every step (a batch of all of them).
    vx2 = VoxCPM2.from_pretrained(vx2_model_dir, scheduler=SchedulerConfig(vocoder_workers=1))
    cv2 = Cadenza.from_pretrained(build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model"))
    models = {"vx2": vx2, "cv2": cv2}
    register_loras(models, [f"vx2:a={folders['a']}", f"b={folders['b']}"], max_loras=3)  # `cadenza serve --lora`
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    config = ServerConfig(api_key=KEY, admin_key=ADMIN, max_lora_bytes=MAX_LORA_BYTES, max_loras=3)
    app = create_app(models, store, config)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        server.client, server.vx2, server.state = client, vx2, app.state.cadenza
        yield server
    for model in models.values():
        model.close()
    store.close()


def _speech(live, **fields) -> httpx.Response:
    body = {"model": "vx2", "input": TEXT, "seed": 7, "response_format": "pcm", **fields}
    return live.client.post("/v1/audio/speech", json=body)


def _pcm(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, dtype="<i2").astype(int)


def _error(r: httpx.Response, status: int, param: str | None, code: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code), err
    return err["message"]


def test_cli_lora_specs_are_checked(live, folders):
    models = {"vx2": live.vx2}
    for value, message in (("a", "expected"), ("x:c=" + str(folders["a"]), "not a served VoxCPM 2 model"),
                           ("a=" + str(folders["a"]), "already registered"),
                           ("c=" + str(folders["a"]), "more than 2 adapters")):
        with pytest.raises(CadenzaError, match=message):
            register_loras(models, [value], max_loras=2 if "more than" in message else 3)
    with pytest.raises(CadenzaError, match="no served model takes LoRA adapters"):
        register_loras({}, ["c=" + str(folders["a"])], max_loras=2)


def test_models_list_the_adapters(live):
    data = {m["id"]: m for m in live.client.get("/v1/models").json()["data"]}
    assert list(data) == ["vx2", "vx2:a", "vx2:b", "cv2"]
    assert data["vx2"]["loras"] == ["a", "b"] and "loras" not in data["cv2"]
    assert data["vx2:b"] == {**data["vx2:b"], "parent": "vx2", "lora": "b", "object": "model"}
    assert data["vx2:b"]["capabilities"] == data["vx2"]["capabilities"]  # clients (the playground) pick it as a model
    assert live.client.get("/v1/models/vx2:a").json()["parent"] == "vx2"
    _error(live.client.get("/v1/models/vx2:zz"), 404, "model", "lora_not_found")
    assert live.state.model("vx2:a").name == "vx2"  # e.g. a voice saved from the playground with an adapter picked


def test_requests_with_two_adapters_and_none_batched_equal_each_alone(live):
    fields = [{"model": "vx2:a"}, {"lora": "b", "stream": False}, {}, {"model": "voxcpm2:b", "stream": False}]
    alone = [_pcm(_speech(live, **f)) for f in fields]
    out: dict[int, httpx.Response] = {}

    def send(i: int) -> None:
        out[i] = _speech(live, **fields[i])

    scheduler = live.vx2.engine.scheduler
    deadline = time.monotonic() + 60
    while scheduler.load != (0, 0):  # the requests alone are freed (at most a step after their end)
        assert time.monotonic() < deadline, "the engine did not become idle"
        time.sleep(0.01)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(fields))]
    with scheduler.exclusive():  # no step before all four are in: they run as one batch
        for t in threads:
            t.start()
        while sum(scheduler.load) < len(fields):
            assert time.monotonic() < deadline, "the requests did not all arrive"
            time.sleep(0.01)
    for t in threads:
        t.join(120)
    assert scheduler.max_batch >= len(fields)
    for i, expected in enumerate(alone):
        got = _pcm(out[i])
        # Batched: the same noise and decisions, numbers equal up to float rounding, so a 16-bit step at most
        assert got.size == expected.size and np.abs(got - expected).max() <= 2, fields[i]
    assert np.array_equal(alone[1], alone[3])  # the field and the model name select the same adapter
    n = min(alone[0].size, alone[2].size)  # and the adapters matter
    assert np.abs(alone[0][:n] - alone[2][:n]).max() > 100 and np.abs(alone[1][:n] - alone[2][:n]).max() > 100


def test_unknown_adapter_is_404_listing_the_registered_ones(live):
    message = _error(_speech(live, model="vx2:nope"), 404, "model", "lora_not_found")
    assert "'nope'" in message and "registered: a, b" in message
    _error(_speech(live, lora="nope"), 404, "lora", "lora_not_found")
    _error(_speech(live, model="vx3:a"), 404, "model", "model_not_found")
    _error(_speech(live, model="vx2:a", lora="b"), 400, "lora", "invalid_value")
    assert "lora" in _error(_speech(live, model="cv2", lora="a", voice=None), 400, "lora", "unsupported_value")
    _error(_speech(live, lora=""), 400, "lora", "invalid_value")
    with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "vx2", "lora": "nope"}))
        error = json.loads(ws.recv(timeout=30))["error"]
    assert (error["code"], error["param"]) == ("lora_not_found", "lora") and "registered: a, b" in error["message"]


def test_websocket_session_with_an_adapter(live):
    with connect(f"{live.ws_url}/v1/audio/speech/stream", additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "vx2:a", "seed": 7}))
        assert json.loads(ws.recv(timeout=30))["type"] == "audio.start"
        ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        audio = []
        while isinstance(message := ws.recv(timeout=60), bytes):
            audio.append(message)
    assert json.loads(message)["type"] == "audio.done"
    got = np.frombuffer(b"".join(audio), dtype="<i2").astype(int)
    expected = _pcm(_speech(live, model="vx2:a"))  # one sentence, the same seed: what the HTTP endpoint says
    assert got.size == expected.size and np.abs(got - expected).max() <= 2


def _upload(live, name="up", config=None, weights=None, model="vx2", headers=ADMIN_AUTH, folder=None):
    folder = folder or live.folders["a"]
    files = {"config": ("lora_config.json", config if config is not None else
                        (folder / "lora_config.json").read_bytes(), "application/json"),
             "weights": ("lora_weights.safetensors", weights if weights is not None else
                         (folder / "lora_weights.safetensors").read_bytes(), "application/octet-stream")}
    data = {"name": name, **({"model": model} if model else {})}
    return httpx.post(f"{live.url}/v1/admin/loras", files=files, data=data, headers=headers, timeout=60)


def test_upload_checks_key_name_sizes_and_contents(live, folders):
    live.folders = folders
    assert _upload(live, headers=AUTH).status_code == 401  # the API key is not the admin key
    _error(_upload(live, name="../up"), 400, "name", "invalid_value")
    _error(_upload(live, name="a" * 65), 400, "name", "invalid_value")
    _error(_upload(live, name="a"), 409, "name", "lora_exists")
    _error(_upload(live, model="cv2"), 400, "model", "unsupported_value")
    _error(_upload(live, weights=b"\0" * (MAX_LORA_BYTES + 1)), 413, "weights", "file_too_large")
    assert _upload(live, weights=b"\0" * (2 * MAX_LORA_BYTES)).status_code == 413  # the body limit, before parsing
    _error(_upload(live, weights=b"not safetensors"), 400, "weights", "invalid_lora")
    _error(_upload(live, config=b"[1]"), 400, "config", "invalid_lora")
    _error(_upload(live, config=b'{"r": 4, "bogus": 1}'), 400, "config", "invalid_lora")
    # b's weights under a's config: the model's layers do not match (a client's error, not a broken model)
    message = _error(_upload(live, weights=(folders["b"] / "lora_weights.safetensors").read_bytes()), 400, "weights",
                     "invalid_lora")
    assert "missing LoRA keys" in message
    assert httpx.get(f"{live.url}/health").json()["status"] == "ok"
    assert live.client.get("/v1/models/vx2").json()["loras"] == ["a", "b"]  # nothing was left behind

    r = _upload(live, model=None)  # the only VoxCPM 2 model
    assert r.status_code == 201, r.text
    assert r.json() == {"object": "lora", "id": "vx2:up", "model": "vx2", "name": "up", "r": 4, "alpha": 8,
                        "parameters": r.json()["parameters"]} and r.json()["parameters"] > 0
    assert np.array_equal(_pcm(_speech(live, model="vx2:up")), _pcm(_speech(live, model="vx2:a")))  # a's weights
    _error(_upload(live, name="four"), 409, "name", "too_many_loras")  # max_loras = 3

    deleted = httpx.delete(f"{live.url}/v1/admin/loras/vx2:up", headers=ADMIN_AUTH)
    assert deleted.json() == {"object": "lora.deleted", "id": "vx2:up", "deleted": True}
    _error(httpx.delete(f"{live.url}/v1/admin/loras/up", headers=ADMIN_AUTH), 404, "lora", "lora_not_found")
    _error(_speech(live, model="vx2:up"), 404, "model", "lora_not_found")
