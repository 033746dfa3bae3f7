"""Speech-server load test: p50/p95 first-chunk latency and real-time factor at 1, 4 and 8 concurrent clients.

Run: ``python benchmarks/server_load.py [--requests-per-client 2] [--timeout 900]``. Starts its own server on
127.0.0.1 (a free port; nothing else is contacted) over the mid-size random model of ``midsize.py``, with a small
byte-level BPE tokenizer trained here (that model has no tokenizer files) and one saved speaker with a random 3 s
prompt. Each client streams ``pcm`` from ``POST /v1/audio/speech`` one request after the other. First-chunk latency:
request sent -> first audio bytes received. RTF: request wall time / seconds of audio received. Random weights
decide each utterance's length (between the LM's min and max ratios of the text length), so the per-request RTF is
the comparable figure. Prints a table, then ``p95_first_chunk_s_c8: X`` last.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from midsize import midsize_engine

from cadenza.api import Cadenza
from cadenza.models.cosyvoice2.frontend import CosyVoice2Frontend
from cadenza.models.cosyvoice2.loader import CosyVoice2Files
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

CORPUS = ["Hello there, this is a small test of the speech synthesizer.",
          "Just by listening a few minutes a day, you will be able to eliminate negative thoughts.",
          "The quick brown fox jumps over the lazy dog while the band plays on."] * 20
TEXTS = ["Hello there, this is a small test.", "The quick brown fox jumps over the lazy dog.",
         "Just by listening a few minutes a day."]
LEVELS = (1, 4, 8)


def toy_tokenizer_dir(directory: Path, vocab_size: int) -> Path:
    """A byte-level BPE in the Qwen file layout (vocab.json, merges.txt, tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(directory))
    n = tok.get_vocab_size()
    added = {str(n + i): {"content": c, "special": True}
             for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    return directory


def build_tts(root: Path) -> Cadenza:
    engine = midsize_engine(max_active=8)
    cfg = engine.config
    blank = toy_tokenizer_dir(root / "CosyVoice-BlankEN", vocab_size=min(1000, cfg.lm.qwen.vocab_size - 20))
    files = CosyVoice2Files(directory=root, config=root / "config.yaml", qwen_config=blank / "config.json",
                            weights={}, tokenizer_dir=blank)
    engine.frontend = CosyVoice2Frontend(files, cfg)
    g = torch.Generator().manual_seed(0)
    n_prompt = 75  # 3 s of prompt speech tokens
    tokens = torch.randint(0, cfg.lm.speech_token_size, (1, n_prompt), generator=g)
    prompt = SpeakerPrompt(prompt_text=torch.randint(0, 500, (1, 10), generator=g), llm_prompt_speech=tokens,
                           flow_prompt_speech=tokens, prompt_mel=torch.randn(1, 2 * n_prompt, cfg.mel.num_mels,
                                                                             generator=g),
                           embedding=torch.randn(1, cfg.flow.spk_embed_dim, generator=g))
    engine.speakers.add("bench", prompt)
    return Cadenza(engine, root)


class Server:
    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def one_request(client: httpx.Client, text: str, seed: int, sample_rate: int) -> tuple[float, float]:
    """(first-chunk latency, RTF) of one streamed request."""
    body = {"model": "cadenza", "input": text, "voice": "bench", "response_format": "pcm", "seed": seed}
    t0 = time.perf_counter()
    first, n_bytes = None, 0
    with client.stream("POST", "/v1/audio/speech", json=body) as r:
        r.raise_for_status()
        for data in r.iter_raw():
            if first is None and data:
                first = time.perf_counter() - t0
            n_bytes += len(data)
    wall = time.perf_counter() - t0
    return first or wall, wall / (n_bytes / 2 / sample_rate)


def run_level(url: str, n_clients: int, per_client: int, sample_rate: int, deadline: float) -> list[tuple]:
    def client_loop(k: int) -> list[tuple[float, float]]:
        out = []
        with httpx.Client(base_url=url, timeout=max(1.0, deadline - time.time())) as client:
            for i in range(per_client):
                if time.time() > deadline:
                    break
                out.append(one_request(client, TEXTS[(k + i) % len(TEXTS)], 1000 * n_clients + 10 * k + i,
                                       sample_rate))
        return out

    with ThreadPoolExecutor(n_clients) as pool:
        return [r for rs in pool.map(client_loop, range(n_clients)) for r in rs]


def pct(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="overall bound in seconds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    deadline = time.time() + args.timeout
    with tempfile.TemporaryDirectory() as tmp:
        tts = build_tts(Path(tmp) / "model")
        voices = VoiceStore(Path(tmp) / "voices")
        app = create_app(tts, voices, ServerConfig(max_concurrency=max(LEVELS) * 2))
        try:
            with Server(app) as server:
                run_level(server.url, 1, 1, tts.sample_rate, deadline)  # warm-up
                results = {n: run_level(server.url, n, args.requests_per_client, tts.sample_rate, deadline)
                           for n in LEVELS}
        finally:
            tts.close()
    print(f"mid-size random model, {args.threads} torch threads, {args.requests_per_client} requests per client")
    print(f"{'clients':>8}{'requests':>10}{'p50 first (s)':>15}{'p95 first (s)':>15}{'p50 RTF':>10}{'p95 RTF':>10}")
    for n, rs in results.items():
        firsts, rtfs = [r[0] for r in rs], [r[1] for r in rs]
        print(f"{n:>8}{len(rs):>10}{pct(firsts, 50):>15.3f}{pct(firsts, 95):>15.3f}{pct(rtfs, 50):>10.2f}"
              f"{pct(rtfs, 95):>10.2f}")
    print(f"p95_first_chunk_s_c8: {pct([r[0] for r in results[8]], 95):.3f}")


if __name__ == "__main__":
    main()
