"""CosyVoice 2 on CPU: float32 against the fast path (``Precision.choose``, docs/performance.md "CPU fast path"), in
one run on the same random weights.

Model: the mid-size random CosyVoice 2 of ``benchmarks/midsize.py`` (``--size full``: the release's sizes, ~0.6 B
parameters, a few minutes). Timed, float32 and the fast path alternating, best of ``--rounds`` each (so load bursts
on a shared machine do not decide the ratio), after a warm-up:

* flow: ``flow.inference`` of ``--seconds`` of speech tokens after a 1 s prompt (whole utterance, 10 Euler steps
  with CFG);
* HiFT: ``hift.inference`` of that mel;
* LM decode: seconds per token of a batch-1 decode step (the same tokens in both: the float32 model's greedy ones);
* end to end: ``synthesize_direct`` of a request that makes exactly ``--seconds`` of audio (LM, flow, HiFT in the
  caller's thread, non-streaming).

Accuracy of the fast path in the same run: SNR of its mel and of HiFT's waveform against float32 (the same mel in,
the same source noise), and the greedy LM tokens' agreement with float32 under teacher forcing (with ``--lm-int8``).
``--flow-int8``: the fast path's flow in float32 with int8 estimator linear layers (``Precision.flow_int8``).
The last line is ``cpu_fast_path_over_fp32: X``: end-to-end float32 seconds / fast-path seconds (above 1: faster).

    python benchmarks/cpu_precision.py [--seconds 5] [--rounds 3] [--threads 1] [--dtype auto] [--lm-int8] [--flow-int8]
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
from midsize import TOKENS_PER_SECOND, fixed_length_request, midsize_config, random_model

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.precision import Precision, detect_cpu
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, SpeakerStore

PROMPT_TOKENS = 25  # 1 s of prompt speech for the flow
TEXT_TOKENS = 30  # LM prompt before the timed decode steps


def snr_db(actual: torch.Tensor, reference: torch.Tensor) -> float:
    a, r = actual.double(), reference.double()
    return float(10 * torch.log10((r**2).sum() / ((a - r) ** 2).sum().clamp(min=1e-30)))


def best_of(rounds: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best wall time of each run, the runs alternating round by round (one warm-up call each first)."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def random_prompt(config: CosyVoice2Config, seed: int) -> SpeakerPrompt:
    gen = torch.Generator().manual_seed(seed)
    flow = config.flow
    empty = torch.zeros(1, 0, dtype=torch.long)
    return SpeakerPrompt(empty, empty, torch.randint(0, flow.vocab_size, (1, PROMPT_TOKENS), generator=gen),
                         torch.randn(1, flow.token_mel_ratio * PROMPT_TOKENS, flow.output_size, generator=gen),
                         torch.randn(1, flow.spk_embed_dim, generator=gen))


def lm_decode(lm, text: torch.Tensor, tokens: list[int]) -> list[int]:
    """Teacher-forced batch-1 decode of ``tokens`` after ``text``: the greedy choice at every step."""
    cache = lm.new_cache(text.size(1) + len(tokens) + 2)
    speech = lm.cfg.speech_token_size
    logp = lm._step(lm.build_input(text), cache, None)
    greedy = []
    for token in tokens:
        greedy.append(int(logp[:speech].argmax()))
        logp = lm._step(lm.speech_step_input(token), cache, None)
    return greedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of speech per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per precision, alternating; the best is kept")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: a per-core comparison; 0 keeps torch's default)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="the fast path to compare (default: what auto picks on this CPU)")
    parser.add_argument("--lm-int8", action="store_true", help="the fast path also runs the LM in int8")
    parser.add_argument("--flow-int8", action="store_true", help="the fast path's flow: float32 with int8 linears")
    parser.add_argument("--size", choices=("mid", "full"), default="mid", help="mid-size or release-size weights")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = detect_cpu()
    fast = Precision.choose(args.dtype, "cpu", lm_int8=args.lm_int8, flow_int8=args.flow_int8)
    print(f"CPU: {cpu.describe()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}")
    flags = "".join(f" + --{n}" for n, on in (("lm-int8", args.lm_int8), ("flow-int8", args.flow_int8)) if on)
    print(f"fast path ({args.dtype}{flags}): {fast.describe()}")
    if fast.is_float32:
        print("note: this CPU has no fast bfloat16 (AMX / AVX-512 BF16): the fast path is float32 itself")

    config = midsize_config() if args.size == "mid" else CosyVoice2Config()
    model = random_model(config)
    engines = {"float32": CosyVoice2Engine(model, None, SpeakerStore(None)),
               "fast": CosyVoice2Engine(copy.deepcopy(model), None, SpeakerStore(None), precision=fast)}
    models = {name: engine.model for name, engine in engines.items()}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.size}-size random CosyVoice 2, {n_params / 1e6:.0f} M parameters; {args.seconds:g} s of speech")

    n_tokens = int(args.seconds * TOKENS_PER_SECOND)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.flow.vocab_size, (1, n_tokens), generator=gen)
    text = torch.randint(0, config.lm.qwen.vocab_size, (1, TEXT_TOKENS), generator=gen)
    voice = random_prompt(config, 2)
    with torch.inference_mode():
        mel = models["float32"].flow.inference(tokens, voice.flow_prompt_speech, voice.prompt_mel, voice.embedding)
        lm_tokens = lm_decode(models["float32"].lm, text, [0] * n_tokens)  # greedy run -> the tokens to replay

        def flow(name):
            return lambda: models[name].flow.inference(tokens, voice.flow_prompt_speech, voice.prompt_mel,
                                                       voice.embedding)

        def hift(name):
            return lambda: models[name].hift.inference(mel, generator=torch.Generator().manual_seed(3))

        def lm(name):
            return lambda: lm_decode(models[name].lm, text, lm_tokens)

        def e2e(name):
            return lambda: engines[name].synthesize_direct(fixed_length_request(engines[name], args.seconds, seed=5))

        rows = []
        for label, make in (("flow", flow), ("HiFT", hift), ("LM decode", lm), ("end to end", e2e)):
            times = best_of(args.rounds, {name: make(name) for name in models})
            if label == "LM decode":  # per token: the prefill is a small part of the run
                times = {k: v / n_tokens for k, v in times.items()}
            rows.append((label, times["float32"], times["fast"]))
            print(f"  {label:<11} float32 {times['float32']:8.4f} s  fast {times['fast']:8.4f} s  "
                  f"x{times['float32'] / times['fast']:.2f}", flush=True)

        mel_fast = flow("fast")()
        wave32, _ = hift("float32")()
        wave_fast, _ = hift("fast")()
        agree = sum(a == b for a, b in zip(lm_decode(models["fast"].lm, text, lm_tokens),
                                           lm_decode(models["float32"].lm, text, lm_tokens))) / n_tokens
    print(f"accuracy: mel SNR {snr_db(mel_fast, mel):.1f} dB, HiFT waveform SNR {snr_db(wave_fast, wave32):.1f} dB, "
          f"greedy LM tokens agreeing {agree:.1%} (random weights: near ties are common, see docs/performance.md)")
    for engine in engines.values():
        engine.close()
    _, e2e32, e2e_fast = rows[-1]
    print(f"cpu_fast_path_over_fp32: {e2e32 / e2e_fast:.2f}")


if __name__ == "__main__":
    main()
