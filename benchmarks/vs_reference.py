"""Cadenza against the reference CosyVoice 2 code on this machine: per stage, end to end and streaming, full size.

You provide a checkout of the reference (https://github.com/FunAudioLLM/CosyVoice with its ``third_party/Matcha-TTS``
submodule) and, if its dependencies are not in this Python, an interpreter that has them (``--reference-python``:
torch, transformers, HyperPyYAML, omegaconf, einops, conformer, diffusers, lightning, scipy). Nothing of the
reference is part of Cadenza; this script only runs it in child processes.

What happens:

1. A reference child builds the release-size model from the reference's own training config
   (``examples/libritts/cosyvoice2/conf/cosyvoice2.yaml``, the same hyper-parameters as the released
   ``cosyvoice2.yaml``; only its model part is read: ``llm``, ``flow``, ``hift``) with its own random initialisation
   and saves ``llm.pt`` / ``flow.pt`` / ``hift.pt`` exactly as the release stores them (HiFT with its weight-norm
   parametrisations). Cadenza loads that folder unchanged, as it loads the released one.
2. The same inputs for both (a 3 s voice prompt: LM prompt text and tokens, flow prompt tokens, prompt mel, speaker
   embedding; text ids whose length fixes the speech length, because EOS is suppressed in both so that both make
   exactly ``20 x text tokens`` speech tokens, the reference's ``max_token_text_ratio``).
3. Each measurement runs in a fresh process per implementation, the two alternating (``--processes`` pairs); inside a
   process, one warm-up and the best of ``--rounds``. Stages: LM (prefill = time to the first token; decode = the
   rest per token; sampling included), flow (``flow.inference`` of the whole utterance after the prompt, 10 Euler
   steps with CFG), HiFT (a fixed mel of the same length), end to end non-streaming (the reference's
   ``CosyVoice2Model.tts(stream=False)``, Cadenza's ``engine.synthesize``: the paths a user calls) and streaming a
   ``--stream-seconds`` utterance (first chunk and total; the reference's ``tts(stream=True)`` with its 25-token
   hop growing to 100, Cadenza's ``engine.stream`` with its defaults).
4. Agreement on the same inputs (Cadenza float32 against the reference): LM prefill log-probabilities, flow mel (both
   use the flow's fixed noise), HiFT waveform (same mel, same seeded source noise).

Cadenza runs in each ``--variants`` precision (``float32``: parity mode; ``auto``: the CPU fast path, bf16 flow and
HiFT where the CPU has AMX / AVX-512 BF16; ``auto+int8``: also the int8 LM). The reference runs as it does on a CPU
(float32; its ``fp16`` flag is CUDA-only). ``--cpus 0`` pins every child to one core (a per-core comparison, even
though both run the LM in a thread beside the vocoder).

The last lines are ``ours_over_reference_<stage>: X`` for the first variant that is not float32 (or float32 if it is
the only one): Cadenza seconds / reference seconds (below 1: faster).

    python benchmarks/vs_reference.py --reference-dir ~/src/CosyVoice [--reference-python ~/ref-venv/bin/python]
        [--threads 1] [--cpus 0] [--rounds 2] [--processes 1] [--seconds 5] [--stream-seconds 30]
        [--variants float32,auto,auto+int8]

Two documented interventions in the reference process, both outside what is timed or neutral to it:
``Qwen2ForCausalLM.from_pretrained`` builds the Qwen2 body from its ``config.json`` (the weights come from ``llm.pt``
right after, as in the release; no Qwen2.5 download), and the reference's modules that import ``torchaudio`` /
``onnxruntime`` for their frontends get empty placeholders when those packages are absent (no timed code uses them).
The reference's streaming hop (``token_hop_len``) is reset before every streamed request: it keeps growing across
calls in one process, which would make a second call start with 100-token chunks.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

SAMPLE_RATE = 24000
TOKENS_PER_SECOND = 25
TOKEN_TEXT_RATIO = 20  # the reference's max_token_text_ratio: speech tokens per text token when EOS never comes
PROMPT_SECONDS = 3
PROMPT_TEXT_TOKENS = 12
MODEL_PART_END = "# gan related module"  # the reference yaml: everything after it is GAN training and data pipeline
YAML_IN_CHECKOUT = "examples/libritts/cosyvoice2/conf/cosyvoice2.yaml"


# --------------------------------------------------------------------------------------------------- shared helpers
def best_timings(rounds: int, run) -> dict[str, float]:
    """``run()`` returns a dict of seconds; the per-key minimum over ``rounds`` runs after one warm-up."""
    run()
    best: dict[str, float] = {}
    for _ in range(rounds):
        for k, v in run().items():
            best[k] = min(best.get(k, float("inf")), v)
    return best


def text_tokens_for(seconds: float) -> int:
    return max(1, round(seconds * TOKENS_PER_SECOND / TOKEN_TEXT_RATIO))


def load_inputs(work: Path) -> dict[str, torch.Tensor]:
    return torch.load(work / "inputs.pt", weights_only=True)


def write_result(work: Path, name: str, result: dict) -> None:
    (work / f"{name}.json").write_text(json.dumps(result, indent=1))


# --------------------------------------------------------------------------------------------------- reference child
def _placeholder_modules() -> list[str]:
    """Empty stand-ins for the reference's frontend-only imports that this Python may lack (never called here)."""
    made = []
    for name, subs in (("torchaudio", ("compliance", "compliance.kaldi", "transforms", "functional")),
                       ("onnxruntime", ()), ("whisper", ())):
        try:
            __import__(name)
        except ImportError:
            root = types.ModuleType(name)
            root.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = root
            for sub in subs:
                mod = types.ModuleType(f"{name}.{sub}")
                sys.modules[f"{name}.{sub}"] = mod
                parent = sys.modules[f"{name}.{sub.rsplit('.', 1)[0]}"] if "." in sub else root
                setattr(parent, sub.rsplit(".", 1)[-1], mod)
            made.append(name)
    return made


def _reference_model(work: Path):
    """The reference's ``CosyVoice2Model`` from the model part of its yaml (``work/reference_model.yaml``)."""
    import transformers  # before the placeholders: it probes which packages exist

    made = _placeholder_modules()
    from hyperpyyaml import load_hyperpyyaml

    def from_config(cls, path, *args, **kwargs):
        return cls(transformers.Qwen2Config.from_pretrained(path))

    transformers.Qwen2ForCausalLM.from_pretrained = classmethod(from_config)
    with open(work / "reference_model.yaml") as f:
        hyper = load_hyperpyyaml(f, overrides={"qwen_pretrain_path": str(work / "model" / "CosyVoice-BlankEN")})
    from cosyvoice.cli.model import CosyVoice2Model

    model = CosyVoice2Model(hyper["llm"].eval(), hyper["flow"].eval(), hyper["hift"].eval())
    return model, made


def reference_init(work: Path) -> None:
    model, made = _reference_model(work)
    out = work / "model"
    torch.save(model.llm.state_dict(), out / "llm.pt")
    torch.save(model.flow.state_dict(), out / "flow.pt")
    torch.save(model.hift.state_dict(), out / "hift.pt")
    n = sum(p.numel() for m in (model.llm, model.flow, model.hift) for p in m.parameters())
    write_result(work, "init", {"parameters": n, "placeholders": made})


def reference_child(work: Path, args: argparse.Namespace, name: str) -> None:
    model, _ = _reference_model(work)
    model.load(str(work / "model" / "llm.pt"), str(work / "model" / "flow.pt"), str(work / "model" / "hift.pt"))
    llm, flow, hift = model.llm, model.flow, model.hift
    sampling_ids = llm.sampling_ids
    # EOS never: both implementations then make exactly 20 x text tokens (the same work on each side).
    llm.sampling_ids = lambda logp, out, k, ignore_eos=True: sampling_ids(logp, out, k, ignore_eos=True)
    x = load_inputs(work)
    i32 = torch.int32

    def lm_generator(text):
        return llm.inference(text=text.to(i32), text_len=torch.tensor([text.shape[1]], dtype=i32),
                             prompt_text=x["prompt_text"].to(i32), prompt_text_len=torch.tensor([PROMPT_TEXT_TOKENS], dtype=i32),
                             prompt_speech_token=x["llm_prompt_speech"].to(i32),
                             prompt_speech_token_len=torch.tensor([x["llm_prompt_speech"].shape[1]], dtype=i32),
                             embedding=x["embedding"])

    def tts(text, stream):
        model.token_hop_len = 25  # it grows across calls in one process (see the module docstring)
        return model.tts(text=text.to(i32), flow_embedding=x["embedding"], llm_embedding=x["embedding"],
                         prompt_text=x["prompt_text"].to(i32), llm_prompt_speech_token=x["llm_prompt_speech"].to(i32),
                         flow_prompt_speech_token=x["flow_prompt_speech"].to(i32), prompt_speech_feat=x["prompt_mel"],
                         stream=stream)

    def flow_mel():
        tokens = x["speech_tokens"]
        prompt = x["flow_prompt_speech"]
        mel, _ = flow.inference(token=tokens.to(i32), token_len=torch.tensor([tokens.shape[1]], dtype=i32),
                                prompt_token=prompt.to(i32), prompt_token_len=torch.tensor([prompt.shape[1]], dtype=i32),
                                prompt_feat=x["prompt_mel"], prompt_feat_len=torch.tensor([x["prompt_mel"].shape[1]], dtype=i32),
                                embedding=x["embedding"], streaming=False, finalize=True)
        return mel

    def hift_wave():
        torch.manual_seed(3)
        wave, _ = hift.inference(speech_feat=x["hift_mel"], cache_source=torch.zeros(1, 1, 0))
        return wave

    with torch.inference_mode():
        result = measure(args, lm_generator, flow_mel, hift_wave,
                         lambda text: torch.cat([c["tts_speech"] for c in tts(text, False)], dim=1).numpy()[0],
                         lambda text: (c["tts_speech"].numpy()[0] for c in tts(text, True)), x)
        # Agreement outputs: prefill log-probabilities (the first step), the flow mel, HiFT's waveform.
        lm_input = torch.cat([llm.llm_embedding.weight[llm.sos].reshape(1, 1, -1),
                              llm.llm.model.model.embed_tokens(torch.cat([x["prompt_text"], x["text"]], 1)),
                              llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1),
                              llm.speech_embedding(x["llm_prompt_speech"])], dim=1)
        n = lm_input.shape[1]
        hidden, _ = llm.llm.forward_one_step(lm_input, masks=torch.tril(torch.ones(1, n, n, dtype=torch.bool)), cache=None)
        np.save(work / f"{name}_logp.npy", llm.llm_decoder(hidden[:, -1]).log_softmax(-1).numpy())
        np.save(work / f"{name}_mel.npy", flow_mel().numpy())
        np.save(work / f"{name}_wave.npy", hift_wave().numpy())
    write_result(work, name, result)


# --------------------------------------------------------------------------------------------------- shared timing
def measure(args, lm_generator, flow_mel, hift_wave, synthesize, stream, x) -> dict:
    """Seconds per stage (best of ``args.rounds`` after a warm-up); the same code path for both implementations."""
    text = x["text"]

    def lm_run():
        start = time.perf_counter()
        gen = lm_generator(text)
        next(gen)
        first = time.perf_counter()
        n = 1 + sum(1 for _ in gen)
        end = time.perf_counter()
        return {"lm_prefill_s": first - start, "lm_decode_s_per_token": (end - first) / max(1, n - 1),
                "lm_tokens": n}

    def timed(label, fn):
        def run():
            start = time.perf_counter()
            fn()
            return {label: time.perf_counter() - start}
        return run

    out: dict = {"threads": torch.get_num_threads(), "cpus": sorted(os.sched_getaffinity(0))}
    lm = best_timings(args.rounds, lm_run)
    out.update(lm)
    out["lm_tokens"] = int(lm["lm_tokens"])
    out.update(best_timings(args.rounds, timed("flow_s", flow_mel)))
    out.update(best_timings(args.rounds, timed("hift_s", hift_wave)))
    samples = []
    out.update(best_timings(args.rounds, timed("e2e_s", lambda: samples.append(len(synthesize(text))))))
    out["e2e_audio_s"] = samples[-1] / SAMPLE_RATE
    if args.stream_seconds > 0:
        long_text = x["stream_text"]
        start = time.perf_counter()
        first, total = None, 0
        for chunk in stream(long_text):
            first = first if first is not None else time.perf_counter() - start
            total += len(chunk)
        out.update({"stream_first_s": first, "stream_total_s": time.perf_counter() - start,
                    "stream_audio_s": total / SAMPLE_RATE})
    return out


# --------------------------------------------------------------------------------------------------- Cadenza child
def ours_child(work: Path, args: argparse.Namespace, name: str, variant: str) -> None:
    from cadenza.engine.cosyvoice2 import CosyVoice2Engine
    from cadenza.engine.precision import Precision
    from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights
    from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, SpeakerStore

    precision = Precision.choose(variant.split("+")[0], "cpu", lm_int8=variant.endswith("+int8"))
    engine = CosyVoice2Engine(load_cosyvoice2_weights(inspect_directory(work / "model")), None, SpeakerStore(None),
                              precision=precision)
    model = engine.model
    x = load_inputs(work)
    voice = SpeakerPrompt(x["prompt_text"], x["llm_prompt_speech"], x["flow_prompt_speech"], x["prompt_mel"],
                          x["embedding"])

    def request(text):
        req = engine.build(text_ids=text, voice=voice, mode="zero_shot", lm_prompt_text=x["prompt_text"],
                           lm_prompt_speech=x["llm_prompt_speech"], seed=0)
        req.min_tokens = req.max_tokens = TOKEN_TEXT_RATIO * text.shape[1]  # EOS never, as in the reference child
        return req

    def flow_mel():
        return model.flow.inference(x["speech_tokens"], x["flow_prompt_speech"], x["prompt_mel"], x["embedding"])

    def hift_wave():
        wave, _ = model.hift.inference(x["hift_mel"], generator=torch.Generator().manual_seed(3))
        return wave

    with torch.inference_mode():
        result = measure(args, lambda text: engine.speech_tokens(request(text)), flow_mel, hift_wave,
                         lambda text: engine.synthesize(request(text)), lambda text: engine.stream(request(text)), x)
        result["precision"] = precision.describe()
        if variant == "float32":
            lm = model.lm
            hidden = lm.forward_hidden(lm.build_input(x["text"], x["prompt_text"], x["llm_prompt_speech"]))
            np.save(work / f"{name}_logp.npy", lm.log_probs(hidden[:, -1]).numpy())
            np.save(work / f"{name}_mel.npy", flow_mel().numpy())
            np.save(work / f"{name}_wave.npy", hift_wave().numpy())
    engine.close()
    write_result(work, name, result)


# --------------------------------------------------------------------------------------------------- parent
def make_inputs(work: Path, seconds: float, stream_seconds: float) -> None:
    from cadenza.models.cosyvoice2.config import CosyVoice2Config
    from cadenza.training.model_files import qwen_json

    cfg = CosyVoice2Config()
    (work / "model" / "CosyVoice-BlankEN").mkdir(parents=True, exist_ok=True)
    (work / "model" / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen_json(cfg.lm.qwen), indent=2))
    gen = torch.Generator().manual_seed(1)
    n_prompt = PROMPT_SECONDS * TOKENS_PER_SECOND
    vocab, speech = cfg.lm.qwen.vocab_size, cfg.flow.vocab_size
    n_tokens = TOKEN_TEXT_RATIO * text_tokens_for(seconds)
    inputs = {
        "prompt_text": torch.randint(0, vocab, (1, PROMPT_TEXT_TOKENS), generator=gen),
        "text": torch.randint(0, vocab, (1, text_tokens_for(seconds)), generator=gen),
        "stream_text": torch.randint(0, vocab, (1, text_tokens_for(max(stream_seconds, 1))), generator=gen),
        "llm_prompt_speech": torch.randint(0, speech, (1, n_prompt), generator=gen),
        "flow_prompt_speech": torch.randint(0, speech, (1, n_prompt), generator=gen),
        "prompt_mel": torch.randn(1, 2 * n_prompt, 80, generator=gen) * 2 - 6,
        "embedding": torch.nn.functional.normalize(torch.randn(1, 192, generator=gen), dim=1),
        "speech_tokens": torch.randint(0, speech, (1, n_tokens), generator=gen),
        "hift_mel": torch.randn(1, 80, 2 * n_tokens, generator=gen) * 2 - 6,
    }
    torch.save(inputs, work / "inputs.pt")


def model_part(reference_yaml: Path) -> str:
    text = reference_yaml.read_text()
    if MODEL_PART_END not in text:
        raise SystemExit(f"{reference_yaml}: no '{MODEL_PART_END}' line: not the CosyVoice 2 training config")
    return text.split(MODEL_PART_END)[0]


def run_child(cmd: list[str], env: dict[str, str], cpus: str | None) -> None:
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"child failed ({proc.returncode}): {' '.join(cmd)}")


def max_diff(work: Path, a: str, b: str, what: str) -> str:
    x, y = np.load(work / f"{a}_{what}.npy"), np.load(work / f"{b}_{what}.npy")
    if x.shape != y.shape:
        return f"shapes differ {x.shape} vs {y.shape}"
    return f"max |diff| {np.abs(x - y).max():.2e} (max |value| {np.abs(y).max():.2e})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-dir", type=Path, help="a checkout of FunAudioLLM/CosyVoice (with third_party/Matcha-TTS)")
    parser.add_argument("--reference-python", default=sys.executable, help="a Python with the reference's dependencies")
    parser.add_argument("--seconds", type=float, default=5.0, help="speech per non-streaming run")
    parser.add_argument("--stream-seconds", type=float, default=30.0, help="speech of the streamed run (0: skip)")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs per stage in a process (best kept)")
    parser.add_argument("--processes", type=int, default=1, help="process pairs per implementation, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every child")
    parser.add_argument("--cpus", default=None, help="pin children to these CPUs (taskset list, e.g. 0)")
    parser.add_argument("--variants", default="float32,auto", help="Cadenza precisions: float32, auto, auto+int8")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep weights and results here")
    parser.add_argument("--child", choices=("init", "reference", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        torch.set_num_threads(args.threads)
        work = args.work_dir
        if args.child == "init":
            torch.manual_seed(0)
            reference_init(work)
        elif args.child == "reference":
            reference_child(work, args, args.name)
        else:
            ours_child(work, args, args.name, args.variant)
        return

    if args.reference_dir is None:
        parser.error("--reference-dir is required")
    from cadenza.engine.precision import detect_cpu

    ref = args.reference_dir.expanduser().resolve()
    matcha = ref / "third_party" / "Matcha-TTS"
    for need in (ref / "cosyvoice" / "cli" / "model.py", ref / YAML_IN_CHECKOUT, matcha / "matcha"):
        if not need.exists():
            raise SystemExit(f"{need} not found: --reference-dir must be a CosyVoice checkout with its Matcha-TTS "
                             "submodule (git submodule update --init)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in ("float32", "auto", "auto+int8", "bfloat16", "bfloat16+int8"):
            parser.error(f"unknown variant {v!r}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="cadenza-vs-reference-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "reference_model.yaml").write_text(model_part(ref / YAML_IN_CHECKOUT))
    (work / "model").mkdir(exist_ok=True)
    (work / "model" / "cosyvoice2.yaml").write_text((ref / YAML_IN_CHECKOUT).read_text())  # as the release ships it
    if not (work / "inputs.pt").is_file():
        make_inputs(work, args.seconds, args.stream_seconds)
    ref_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ref), str(matcha)]))
    ours_env = dict(os.environ)
    this = [str(Path(__file__).resolve())]
    common = ["--work-dir", str(work), "--threads", str(args.threads), "--rounds", str(args.rounds),
              "--stream-seconds", str(args.stream_seconds)]
    if not (work / "model" / "hift.pt").is_file():
        print("building release-size random weights with the reference's modules ...", flush=True)
        run_child([args.reference_python, *this, "--child", "init", *common], ref_env, args.cpus)
    init = json.loads((work / "init.json").read_text())
    print(f"model: release-size CosyVoice 2, {init['parameters'] / 1e6:.0f} M parameters (random, reference init); "
          f"placeholders in the reference process: {init['placeholders'] or 'none'}")
    print(f"machine: {detect_cpu().describe()}, {args.threads} thread(s), cpus {args.cpus or 'all'}, torch {torch.__version__}")

    runs: dict[str, list[dict]] = {}
    for p in range(args.processes):
        order = [("reference", None), *((f"ours[{v}]", v) for v in variants)]
        if p % 2:
            order.reverse()
        for label, variant in order:
            name = f"{'reference' if variant is None else 'ours_' + variant.replace('+', '_')}_{p}"
            if variant is None:
                cmd = [args.reference_python, *this, "--child", "reference", "--name", name, *common]
                run_child(cmd, ref_env, args.cpus)
            else:
                cmd = [sys.executable, *this, "--child", "ours", "--name", name, "--variant", variant, *common]
                run_child(cmd, ours_env, args.cpus)
            runs.setdefault(label, []).append(json.loads((work / f"{name}.json").read_text()))
            print(f"  {label}: done", flush=True)

    def best(label: str, key: str) -> float:
        return min(r[key] for r in runs[label])

    keys = [("lm_prefill_s", "LM prefill (s)"), ("lm_decode_s_per_token", "LM decode (s/token)"),
            ("flow_s", "flow (s)"), ("hift_s", "HiFT (s)"), ("e2e_s", "end to end (s)")]
    if args.stream_seconds > 0:
        keys += [("stream_first_s", "stream first chunk (s)"), ("stream_total_s", "stream total (s)")]
    labels = list(runs)
    print(f"\n{'stage':<24}" + "".join(f"{lab:>20}" for lab in labels))
    for key, title in keys:
        print(f"{title:<24}" + "".join(f"{best(lab, key):>20.4f}" for lab in labels))
    ref_run = runs["reference"][0]
    print(f"(LM tokens {ref_run['lm_tokens']}, audio {ref_run['e2e_audio_s']:.2f} s non-streaming"
          + (f", {ref_run['stream_audio_s']:.2f} s streamed" if args.stream_seconds > 0 else "") + ")")
    for label in labels[1:]:
        run = runs[label][0]
        print(f"{label}: precision {run['precision']}; audio {run['e2e_audio_s']:.2f} s"
              + (f", {run['stream_audio_s']:.2f} s streamed" if args.stream_seconds > 0 else ""))
    if "float32" in variants:
        ours32 = f"ours_float32_{0}"
        for what in ("logp", "mel", "wave"):
            print(f"agreement {what:<5} ours[float32] vs reference: {max_diff(work, ours32, 'reference_0', what)}")
    head = next((f"ours[{v}]" for v in variants if v != "float32"), f"ours[{variants[0]}]")
    for key, _ in keys:
        print(f"ours_over_reference_{key.removesuffix('_s')}: {best(head, key) / best('reference', key):.2f}")


if __name__ == "__main__":
    main()
