"""Reproduce cadenza-tiny from nothing: corpus -> every training stage -> the model folder shipped in the package.

    bash recipes/tiny/setup_tools.sh               # once: Debian synthesizers + a tools venv (teachers, GPL piper)
    python recipes/tiny/run.py --work WORK         # everything below; re-run the same command to resume

Steps (each is skipped when its output exists; training stages resume from their newest checkpoint):
  corpus      recipes/tiny/build_corpus.py in the tools venv     -> WORK/corpus (manifest.jsonl, test lists)
  text        byte-level BPE in the Qwen2 file format             -> WORK/text_tokenizer
  prepare     cadenza data prepare (24 kHz wav, mel, f0; 2 parts)  -> WORK/data
  tokenizer + speaker (in parallel)                               -> WORK/runs/{tokenizer,speaker}
  extract     speech tokens + x-vectors into WORK/data (cadenza data extract)
  hift        starts right after `prepare`, beside the others     -> WORK/runs/hift
  lm + flow (in parallel)                                         -> WORK/runs/{lm,flow}
  hift_refine generator-only refinement of the hift export         -> WORK/runs/hift_refine
  second round (the shipped weights; docs/cadenza-tiny.md says why):
  hift_gan    GAN training from the refined vocoder, beside the rest -> WORK/runs/hift_gan
  tokenizer_v2  the tokenizer continued to 2,200 steps             -> WORK/runs/tokenizer_v2
  extract_v2  WORK/data hard-linked to WORK/data_v2 with the new speech tokens
  lm_v2 + flow_v2 (in parallel) warm-started from lm and flow       -> WORK/runs/{lm_v2,flow_v2}
  third round (more text: the LM had learned its corpus by heart):
  prepare_v3  the extended corpus (manifest_extended.jsonl: + EXTRA_MINUTES per fast teacher) -> WORK/data_v3,
              speech tokens from runs/tokenizer_v2, x-vectors from runs/speaker
  lm_v3 + flow_v3 (in parallel) warm-started from lm_v2 and flow_v2; lm_v3 exports its best held-out evaluation
  assemble    recipes/tiny/package.py                             -> WORK/model (and --install: the package copy)
Each training process gets one CPU thread (`--threads`), so on a 2-core machine two stages share the CPU.
`--scale 0.1` shortens every stage to a tenth (a smoke run of the whole recipe).

`--design v2` (the shipped weights since 2026-12-03; docs/cadenza-tiny.md says why) continues from the v1 runs above:
  corpus_v2   recipes/tiny/aligned_corpus.py: Piper joe fed espeak-ng phonemes, phoneme-per-frame tokens from its
              own durations                                       -> WORK/corpus_v2
  prepare_v2  cadenza data prepare + the alignment's tokens and text ids (manifest_arrays) + x-vectors from
              runs/speaker                                        -> WORK/data_p
  lm_phoneme + flow_phoneme (in parallel; the flow warm-started from runs/flow_v3, a new token embedding), then
  frame_tokenizer (the phoneme-per-frame ids from audio, for prompts)
  package     recipes/tiny/package.py --design v2 (HiFT and speaker encoder from v1, or hift_joe)
  --from-shipped: the shipped folder stands in for lm_phoneme / flow_phoneme / frame_tokenizer; then (in parallel)
  flow_phoneme_r2 (--more-flow) one more flow round                 -> WORK/runs/flow_phoneme_r2
  corpus_v3 + flow_phoneme_rates (--rates-flow, after those): 9,000 new sentences read at rates 0.5-1.2 (data_q),
              a flow round on them from the newest flow           -> WORK/runs/flow_phoneme_rates
  hift_joe_flowmel (--flow-mel-hift): the built-in flow's mels of corpus_v3 (flow_mel), the shipped vocoder
              fine-tuned on them                                  -> WORK/runs/hift_joe_flowmel
  frame_tokenizer_r2 (--more-tokenizer [CONFIG]): the shipped frame tokenizer continued on corpus_v3
              (frame_tokenizer_voices: heard in other voices too; frame_tokenizer_flite: with three flite voices,
              corpus_f -> data_f; frame_tokenizer_kokoro: with four Kokoro voices too, corpus_k -> data_k)
                                                                  -> WORK/runs/CONFIG
  flow_phoneme_voices (--voices-flow): a flow round on data_f (joe, three flite voices) -> WORK/runs/flow_phoneme_voices
  corpus_r + flow_phoneme_speed, corpus_r2 + flow_phoneme_speed_fast (--speed-flow): 6,000 sentences read 0.5-2.1x
              as fast as their tokens (data_r), a flow round on them from the newest flow, then 4,000 more read up to
              ~2.1x (data_r2) and a round from that one (speed_method="flow") -> WORK/runs/flow_phoneme_speed_fast
  hift_joe (--more-hift [CONFIG[,CONFIG...]]) a HiFT continued on joe, rounds in turn -> WORK/runs/hift_joe
              (the shipped v2 vocoder round: --more-hift hift_joe_tfv,hift_joe_tf_gan, from v1's HiFT in runs/hift_gan)
  hift_joe_average (--long-hift [CONFIG]): the shipped HiFT continued as a long GAN on joe's second corpus (data_q),
              its weights' moving average exported (hift_joe_pitch: with speed-perturbed crops and frame-period
              discriminators, to follow the source's pitch; hift_joe_even_r2: the shipped buzz-free vocoder with fresh
              discriminators warmed up first, measured and not shipped) -> WORK/runs/CONFIG
  hift_joe_pitch_3000 + hift_joe_phone (--phone-hift): the pitch round to step 3,000, then continued with the phone
              loss (the shipped frame tokenizer listening for the words) -> WORK/runs/hift_joe_phone
  hift_joe_even (--even-hift): the phone round's last checkpoint continued with its first upsampler held to equal
              phase gains (no 50 Hz buzz)                          -> WORK/runs/hift_joe_even
  hift_joe_even_r2_2000 + hift_joe_phase (--phase-hift): hift_joe_even_r2 to step 2,000, then continued with the
              instantaneous-frequency loss to step 4,000            -> WORK/runs/hift_joe_phase
Training stages use bf16 autocast where the CPU has native bf16 (AMX / AVX512-BF16), float32 elsewhere.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parents[1] / "src" / "cadenza" / "assets" / "cadenza-tiny"  # the built-in model folder
STAGES = ("tokenizer", "speaker", "hift", "lm", "flow")
ARRAYS_EXTRACTOR = "cadenza.data.extractors:manifest_arrays"  # =arrays.jsonl: labels and text ids per utterance
SPEAKER_EXTRACTOR = "cadenza.training.speaker_encoder_stage:speaker_embedding_extractor"  # =a speaker encoder run
EXTRA_MINUTES = 50  # third round: more minutes per fast teacher (flite, festival, Piper), new sentences only


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Recipe:
    def __init__(self, work: Path, tools_python: str, threads: int, scale: float) -> None:
        self.work, self.tools_python, self.scale = work.resolve(), tools_python, scale
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.cadenza = [sys.executable, "-m", "cadenza.cli.main"]

    def run(self, cmd: list[str], log_name: str) -> None:
        _log(" ".join(cmd))
        with open(self.work / "logs" / f"{log_name}.log", "a") as log:
            subprocess.run(cmd, check=True, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def start(self, cmd: list[str], log_name: str) -> subprocess.Popen:
        _log("started " + " ".join(cmd))
        log = open(self.work / "logs" / f"{log_name}.log", "a")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    @staticmethod
    def wait(*procs: subprocess.Popen) -> None:
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"failed: {' '.join(map(str, p.args))} (see the logs folder)")

    def config(self, name: str) -> Path:
        """The config ``configs/<name>.yaml`` with WORK substituted and the step counts scaled."""
        import yaml

        text = (HERE / "configs" / f"{name}.yaml").read_text().replace("WORK/", f"{self.work}/")
        runs = self.work / "runs"  # SHIPPED flow: the newest finished v2 flow round (the shipped one with --from-shipped)
        newest_flow = next((runs / n for n in ("flow_phoneme_r2", "flow_phoneme") if (runs / n / "done").is_file()),
                           runs / "flow_phoneme")
        text = text.replace("init_flow: SHIPPED", f"init_flow: {newest_flow}")
        text = text.replace("init_hift: SHIPPED", f"init_hift: {SHIPPED}")
        text = text.replace("init_tokenizer: SHIPPED", f"init_tokenizer: {SHIPPED}")
        text = text.replace("phone_model: SHIPPED", f"phone_model: {SHIPPED}")  # the phone loss's recogniser
        text = text.replace("init_hift: RUN:", f"init_hift: {self.work / 'runs'}/")  # another run's export
        cfg = yaml.safe_load(text)
        cfg["train"]["max_steps"] = max(1, round(cfg["train"]["max_steps"] * self.scale))
        if "adversarial_start" in cfg.get("hift", {}):
            cfg["hift"]["adversarial_start"] = round(cfg["hift"]["adversarial_start"] * self.scale)
        out = self.work / "configs" / f"{name}.yaml"
        out.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return out

    def train(self, stage: str, name: str | None = None, data: str = "data",
              config: str | None = None, max_steps: int | None = None) -> subprocess.Popen | None:
        """Start stage ``stage`` with ``configs/<config or name>.yaml`` (default: the stage's own) into
        ``runs/<name>``; ``max_steps`` (scaled like the configs' own) stops it before the config's end."""
        name = name or stage
        out = self.work / "runs" / name
        if (out / "done").is_file():
            return None
        cmd = [*self.cadenza, "train", stage, "--config", str(self.config(config or name)), "--data", str(self.work / data),
               "--out", str(out)]
        if max_steps is not None:
            cmd += ["--max-steps", str(max(1, round(max_steps * self.scale)))]
        if (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("step_*.pt")):
            cmd.append("--resume")
        return self.start(cmd, name)

    def train_through(self, stage: str, name: str, data: str = "data", config: str | None = None,
                      max_steps: int | None = None) -> None:
        """``train`` one run and wait for it (nothing runs when it is done already), then mark it done."""
        proc = self.train(stage, name, data, config=config, max_steps=max_steps)
        if proc is not None:
            self.wait(proc)
        self.mark_done(name)

    def hift_rounds(self, configs: list[str]) -> None:
        """HiFT rounds on joe's corpus (``data_p``), one after another: ``configs[i]`` into ``runs/<configs[i]>``,
        the last into ``runs/hift_joe`` (what package.py takes); a round may start from an earlier one's export
        (``init_hift: RUN:<name>``)."""
        for i, config in enumerate(configs):
            name = "hift_joe" if i == len(configs) - 1 else config
            self.train_through("hift", name, "data_p", config=config)

    def continue_run(self, source: str, name: str) -> None:
        """Seed ``runs/<name>`` with the newest checkpoint of ``runs/<source>``: ``name`` resumes from it on its own
        (longer) schedule."""
        ckpts = self.work / "runs" / name / "checkpoints"
        if ckpts.is_dir() and any(ckpts.glob("step_*.pt")):
            return
        newest = max((self.work / "runs" / source / "checkpoints").glob("step_*.pt"),
                     key=lambda p: int(p.stem.split("_")[1]))
        ckpts.mkdir(parents=True, exist_ok=True)
        shutil.copy2(newest, ckpts / newest.name)

    def extract(self, data: str, log_name: str, **runs: str) -> None:
        """``cadenza data extract`` into WORK/<data> with the extractors of ``runs`` (``tokens=``: a speech tokenizer
        run, ``speakers=``: a speaker encoder run), unless done before (``extracted.ok``)."""
        factories = {"tokens": "cadenza.training.speech_tokenizer_stage:speech_token_extractor",
                     "speakers": SPEAKER_EXTRACTOR}
        self.extract_once(data, "extracted.ok", log_name,
                          *(f"{factories[kind]}={self.work / 'runs' / run}" for kind, run in runs.items()))

    def extract_once(self, data: str, marker: str, log_name: str, *extractors: str) -> None:
        """``cadenza data extract`` into WORK/<data> with ``extractors`` (``module:factory=ARG``), unless
        WORK/<data>/<marker> says it was done."""
        done = self.work / data / marker
        if done.is_file():
            return
        cmd = [*self.cadenza, "data", "extract", "--data", str(self.work / data), "--no-progress"]
        for extractor in extractors:
            cmd += ["--extractor", extractor]
        self.run(cmd, log_name)
        done.write_text("ok\n")

    def extract_tokens_v2(self) -> None:
        """WORK/data_v2: WORK/data's shards hard-linked (no copy), with speech tokens from runs/tokenizer_v2."""
        w = self.work
        if not (w / "data_v2" / "extracted.ok").is_file():
            shutil.rmtree(w / "data_v2", ignore_errors=True)
            shutil.copytree(w / "data", w / "data_v2", copy_function=os.link)
            for p in [*(w / "data_v2" / "shards").glob("*.speech_tokens.*"),
                      w / "data_v2" / "rejected.speech_tokens.jsonl", w / "data_v2" / "extracted.ok"]:
                p.unlink(missing_ok=True)
        self.extract("data_v2", "extract_v2", tokens="tokenizer_v2")

    def prepare(self, manifest: Path, data: str) -> None:
        """``cadenza data prepare`` of ``manifest`` into WORK/<data> (24 kHz wav, mel, f0; 2 processes), unless
        done before."""
        w = self.work
        if (w / data / "index.jsonl").is_file():
            return
        parts = [self.start([*self.cadenza, "data", "prepare", "--corpus", str(manifest),
                             "--layout", "jsonl", "--out", str(w / data), "--max-seconds", "15",
                             "--part", str(i), "--num-parts", "2", "--no-progress"], f"prepare_{data}{i}")
                 for i in range(2)]
        self.wait(*parts)

    def mark_done(self, *stages: str) -> None:
        for s in stages:
            (self.work / "runs" / s / "done").write_text("ok\n")

    def all(self, install: bool) -> None:
        w = self.work
        for d in ("logs", "configs", "runs"):
            (w / d).mkdir(parents=True, exist_ok=True)
        if not (w / "corpus" / "manifest_extended.jsonl").is_file():  # renders what is missing (resumes)
            self.run([self.tools_python, str(HERE / "build_corpus.py"), "--out", str(w / "corpus"),
                      "--extra-minutes", str(EXTRA_MINUTES)], "corpus")
        if not (w / "text_tokenizer" / "merges.txt").is_file():
            self.run([sys.executable, str(HERE / "text_tokenizer.py"), "--corpus", str(w / "corpus" / "manifest.jsonl"),
                      "--out", str(w / "text_tokenizer")], "text")
        self.prepare(w / "corpus" / "manifest.jsonl", "data")
        hift = self.train("hift")
        front = [p for p in (self.train("tokenizer"), self.train("speaker")) if p is not None]
        self.wait(*front)
        self.mark_done("tokenizer", "speaker")
        self.extract("data", "extract", tokens="tokenizer", speakers="speaker")
        back = [p for p in (self.train("lm"), self.train("flow")) if p is not None]
        self.wait(*back)
        self.mark_done("lm", "flow")
        if hift is not None:
            self.wait(hift)
        self.mark_done("hift")
        self.train_through("hift", "hift_refine")  # generator-only refinement from the hift export

        gan = self.train("hift", "hift_gan")
        self.continue_run("tokenizer", "tokenizer_v2")
        self.train_through("tokenizer", "tokenizer_v2")
        self.extract_tokens_v2()
        back = [p for p in (self.train("lm", "lm_v2", "data_v2"), self.train("flow", "flow_v2", "data_v2")) if p]
        self.wait(*back)
        self.mark_done("lm_v2", "flow_v2")
        self.prepare(w / "corpus" / "manifest_extended.jsonl", "data_v3")
        self.extract("data_v3", "extract_v3", tokens="tokenizer_v2", speakers="speaker")
        back = [p for p in (self.train("lm", "lm_v3", "data_v3"), self.train("flow", "flow_v3", "data_v3")) if p]
        self.wait(*back)
        self.mark_done("lm_v3", "flow_v3")
        if gan is not None:
            self.wait(gan)
        self.mark_done("hift_gan")
        cmd = [sys.executable, str(HERE / "package.py"), "--work", str(w)]
        self.run(cmd + (["--install"] if install else []), "package")
        _log(f"done: {w / 'model'}")


    def seed_runs(self, model: Path, runs: dict[str, tuple[str, ...]]) -> None:
        """Stand-in runs (marked done) holding files copied from a model folder, for runs WORK does not have."""
        for run, files in runs.items():
            if (self.work / "runs" / run / "done").is_file():
                continue
            (self.work / "runs" / run).mkdir(parents=True, exist_ok=True)
            for f in files:
                (self.work / "runs" / run / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(model / f, self.work / "runs" / run / f)
            (self.work / "runs" / run / "from_model.txt").write_text(f"copied from {model}\n")
            self.mark_done(run)

    def aligned_data(self, corpus: str, data: str, *corpus_args: str) -> None:
        """WORK/<corpus> rendered by aligned_corpus.py (``corpus_args`` passed on), prepared into WORK/<data> (2
        processes) with the alignment's tokens and text ids and x-vectors from runs/speaker; each step skipped once
        done."""
        w = self.work
        if not (w / corpus / "arrays.jsonl").is_file():
            self.run([sys.executable, str(HERE / "aligned_corpus.py"), "--out", str(w / corpus), *corpus_args], corpus)
        self.prepare(w / corpus / "manifest.jsonl", data)
        self.extract_once(data, "extracted.ok", f"extract_{data}",
                          f"{ARRAYS_EXTRACTOR}={w / corpus / 'arrays.jsonl'}", f"{SPEAKER_EXTRACTOR}={w / 'runs' / 'speaker'}")

    def flite_data(self) -> None:
        """WORK/corpus_f (flite_corpus.py: three flite voices, labelled from flite's phone timings, plus joe's
        corpus_v3 rows) prepared into WORK/data_f with the labels; each step skipped once done."""
        w = self.work
        if not (w / "corpus_f" / "arrays.jsonl").is_file():
            self.run([sys.executable, str(HERE / "flite_corpus.py"), "--out", str(w / "corpus_f"), "--sentences",
                      str(w / "corpus_v3" / "manifest.jsonl"), "--with-corpus", str(w / "corpus_v3")], "corpus_f")
        self.prepare(w / "corpus_f" / "manifest.jsonl", "data_f")
        self.extract_once("data_f", "extracted.ok", "extract_data_f",
                          f"{ARRAYS_EXTRACTOR}={w / 'corpus_f' / 'arrays.jsonl'}")

    def kokoro_data(self) -> None:
        """WORK/corpus_k (kokoro_corpus.py: four Kokoro voices labelled with Kokoro's own durations, in the tools
        environment, plus corpus_f's rows) prepared into WORK/data_k with the labels; each step skipped once done."""
        w = self.work
        self.flite_data()
        if not (w / "corpus_k" / "arrays.jsonl").is_file():
            self.run([self.tools_python, str(HERE / "kokoro_corpus.py"), "--out", str(w / "corpus_k"), "--sentences",
                      str(w / "corpus_v3" / "manifest.jsonl"), "--with-corpus", str(w / "corpus_f"), "--phonemes",
                      str(SHIPPED / "CosyVoice-BlankEN" / "phonemes.json")], "corpus_k")
        self.prepare(w / "corpus_k" / "manifest.jsonl", "data_k")
        self.extract_once("data_k", "extracted.ok", "extract_data_k",
                          f"{ARRAYS_EXTRACTOR}={w / 'corpus_k' / 'arrays.jsonl'}")

    def v2(self, install: bool, v1_model: Path | None, from_shipped: bool = False, more_flow: bool = False,
           more_hift: str | None = None, rates_flow: bool = False, flow_mel_hift: bool = False,
           more_tokenizer: str | None = None, voices_flow: bool = False, speed_flow: bool = False,
           long_hift: str | None = None, phone_hift: bool = False, even_hift: bool = False,
           phase_hift: bool = False) -> None:
        """The phoneme design (see the module docstring). ``v1_model``: a v1 model folder (the shipped float16 one)
        standing in for the v1 runs it needs (speaker, flow_v3, hift_gan) when WORK has none. ``from_shipped``: the
        shipped v2 folder stands in for the first v2 round (LM, flow, frame tokenizer); ``more_flow``: another round
        of the flow (configs/flow_phoneme_r2.yaml) from the newest v2 flow; ``more_hift``: the config (``hift_joe``,
        ``hift_joe_source``, ``hift_joe_tf``), or comma-separated configs run one after another (the v2 vocoder
        round: ``hift_joe_tfv,hift_joe_tf_gan``), that continue a vocoder on joe's corpus into runs/hift_joe, beside the
        flow round; ``rates_flow``: a second corpus of new sentences read at rates 0.5-1.2 (WORK/corpus_v3 ->
        WORK/data_q) and a flow round on it (configs/flow_phoneme_rates.yaml) from the newest v2 flow;
        ``flow_mel_hift``: the built-in model's flow mels of that corpus (``flow_mel``, from the teacher's timings)
        and the shipped vocoder fine-tuned on them (configs/hift_joe_flowmel.yaml -> runs/hift_joe_flowmel);
        ``more_tokenizer``: the config (``frame_tokenizer_r2``, ``frame_tokenizer_voices``) that continues the shipped
        frame tokenizer on that corpus, into runs/<config>; ``voices_flow``: a flow round from the shipped flow on
        joe's second corpus plus three flite voices (configs/flow_phoneme_voices.yaml, WORK/data_f with x-vectors);
        ``speed_flow``: speaking-rate pairs (WORK/corpus_r -> WORK/data_r, audio read 0.5-2.1x as fast as its tokens)
        and a flow round on them (configs/flow_phoneme_speed.yaml) from the newest v2 flow, then fast pairs
        (WORK/corpus_r2 -> WORK/data_r2) and a round from that one (configs/flow_phoneme_speed_fast.yaml);
        ``long_hift``: the config (``hift_joe_average``, ``hift_joe_pitch``) that continues the shipped vocoder as a
        long GAN on WORK/data_q with its weights' moving average exported, into runs/<config>; ``phone_hift``: the
        pitch round (configs/hift_joe_pitch.yaml) to step 3,000, continued with the phone loss
        (configs/hift_joe_phone.yaml) into runs/hift_joe_phone; ``even_hift``: that round's last checkpoint continued
        with ups.0 held to equal phase gains (configs/hift_joe_even.yaml) into runs/hift_joe_even; ``phase_hift``: the
        shipped vocoder continued (configs/hift_joe_even_r2.yaml) to step 2,000, then with the instantaneous-frequency
        loss (configs/hift_joe_phase.yaml) into runs/hift_joe_phase."""
        w = self.work
        for d in ("logs", "configs", "runs"):
            (w / d).mkdir(parents=True, exist_ok=True)
        if from_shipped:
            blank = ("cosyvoice2.yaml", "CosyVoice-BlankEN/config.json", "CosyVoice-BlankEN/phonemes.json")
            self.seed_runs(SHIPPED, {"lm_phoneme": ("llm.pt", *blank), "flow_phoneme": ("flow.pt", *blank),
                                     "frame_tokenizer": ("speech_tokenizer.safetensors", "speech_tokenizer.json")})
        if v1_model is not None:
            self.seed_runs(v1_model, {"speaker": ("speaker_encoder.safetensors", "speaker_encoder.json"),
                                      "flow_v3": ("flow.pt",), "hift_gan": ("hift.pt", "cosyvoice2.yaml")})
        self.aligned_data("corpus_v2", "data_p")
        back = [p for p in (self.train("lm", "lm_phoneme", "data_p"), self.train("flow", "flow_phoneme", "data_p"))
                if p is not None]
        self.wait(*back)
        self.mark_done("lm_phoneme", "flow_phoneme")
        self.train_through("frame_tokenizer", "frame_tokenizer", "data_p")
        # The flow round runs beside the HiFT rounds; the HiFT rounds run one after another (each may start from
        # the one before: ``init_hift: RUN:<config>``), the last into runs/hift_joe, which package.py takes.
        flow = self.train("flow", "flow_phoneme_r2", "data_p") if more_flow else None
        self.hift_rounds(more_hift.split(",") if more_hift else [])
        if flow is not None:
            self.wait(flow)
        if more_flow:
            self.mark_done("flow_phoneme_r2")
        if (rates_flow or flow_mel_hift or more_tokenizer or voices_flow or long_hift or phone_hift or even_hift
                or phase_hift):
            self.aligned_data("corpus_v3", "data_q", "--seed", "1", "--length-scale", "0.5", "1.2",
                              "--id-prefix", "joe_s1", "--utterances", "9000")
        if rates_flow:
            self.train_through("flow", "flow_phoneme_rates", "data_q")
        if long_hift:  # the shipped vocoder as a long GAN, its weights' average exported (configs/<long_hift>.yaml)
            self.train_through("hift", long_hift, "data_q")
        if phone_hift:  # the pitch round's first 3,000 steps, then the phone loss from its checkpoint
            self.train_through("hift", "hift_joe_pitch_3000", "data_q", config="hift_joe_pitch", max_steps=3000)
            self.continue_run("hift_joe_pitch_3000", "hift_joe_phone")
            self.train_through("hift", "hift_joe_phone", "data_q")
        if even_hift:  # the phone round's checkpoint (run --phone-hift first), its 50 Hz buzz projected away
            self.continue_run("hift_joe_phone", "hift_joe_even")
            self.train_through("hift", "hift_joe_even", "data_q")
        if phase_hift:  # the shipped vocoder's continuation to step 2,000, then the phase loss from its checkpoint
            self.train_through("hift", "hift_joe_even_r2_2000", "data_q", config="hift_joe_even_r2", max_steps=2000)
            self.continue_run("hift_joe_even_r2_2000", "hift_joe_phase")
            self.train_through("hift", "hift_joe_phase", "data_q")
        if more_tokenizer:
            data = "data_q"
            if more_tokenizer == "frame_tokenizer_flite":  # joe's second corpus and three flite voices
                self.flite_data()
                data = "data_f"
            if more_tokenizer == "frame_tokenizer_kokoro":  # and four Kokoro voices
                self.kokoro_data()
                data = "data_k"
            self.train_through("frame_tokenizer", more_tokenizer, data)
        if voices_flow:
            self.flite_data()
            self.extract_once("data_f", "spk_emb.ok", "extract_data_f_spk",
                              f"{SPEAKER_EXTRACTOR}={w / 'runs' / 'speaker'}")
            self.train_through("flow", "flow_phoneme_voices", "data_f")
        if speed_flow:  # two rounds: all rates, then the fast ones (configs/flow_phoneme_speed*.yaml)
            self.aligned_data("corpus_r", "data_r", "--seed", "2", "--speeds", "0.5", "2.1", "--id-prefix", "joe_r",
                              "--utterances", "6000")
            self.train_through("flow", "flow_phoneme_speed", "data_r")
            self.aligned_data("corpus_r2", "data_r2", "--seed", "3", "--speeds", "0.7", "4", "--at-speed-one", "0.15",
                              "--id-prefix", "joe_f", "--utterances", "4000")
            self.train_through("flow", "flow_phoneme_speed_fast", "data_r2")
        if flow_mel_hift:
            self.extract_once("data_q", "flow_mel.ok", "extract_flow_mel",
                              f"cadenza.training.hift.flow_mels:flow_mel_extractor={SHIPPED}")
            self.train_through("hift", "hift_joe_flowmel", "data_q")
        cmd = [sys.executable, str(HERE / "package.py"), "--work", str(w), "--design", "v2"]
        self.run(cmd + (["--install"] if install else []), "package")
        _log(f"done: {w / 'model'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path, help="working folder (corpus, data, runs, model)")
    p.add_argument("--tools-python", default=os.environ.get("CADENZA_TOOLS_PYTHON", "/work/tools-venv/bin/python"),
                   help="the python of the tools venv (setup_tools.sh) that runs the teacher synthesizers")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per training process")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every stage's step count (0.1: smoke run)")
    p.add_argument("--install", action="store_true", help="copy the result into src/cadenza/assets/cadenza-tiny")
    p.add_argument("--design", choices=("v1", "v2"), default="v2",
                   help="v2 (default): the v1 rounds, then the phoneme design; v1: stop after the v1 rounds")
    p.add_argument("--v1-model", type=Path, default=None,
                   help="with --design v2: a v1 model folder standing in for the v1 runs (skips the v1 rounds)")
    p.add_argument("--from-shipped", action="store_true",
                   help="with --design v2: the shipped v2 weights stand in for the first v2 round (continue from them)")
    p.add_argument("--more-flow", action="store_true",
                   help="with --design v2: one more flow round (configs/flow_phoneme_r2.yaml) from the newest v2 flow")
    p.add_argument("--more-hift", nargs="?", const="hift_joe", default=None, metavar="CONFIG",
                   help="with --design v2: the shipped HiFT continued on joe's corpus (configs/CONFIG.yaml, default "
                        "hift_joe: as a GAN; hift_joe_source: its harmonic source reset, an STFT loss; hift_joe_tf: that source "
                        "driven by the data's f0 while training); CONFIG,CONFIG...: rounds one after another, the last into "
                        "runs/hift_joe (the v2 vocoder round: hift_joe_tfv,hift_joe_tf_gan)")
    p.add_argument("--rates-flow", action="store_true",
                   help="with --design v2: 9,000 new sentences read at rates 0.5-1.2 (WORK/corpus_v3) and a flow round "
                        "on them (configs/flow_phoneme_rates.yaml) from the newest v2 flow")
    p.add_argument("--flow-mel-hift", action="store_true",
                   help="with --design v2: the shipped vocoder fine-tuned on the built-in flow's own mels of "
                        "WORK/corpus_v3 (configs/hift_joe_flowmel.yaml)")
    p.add_argument("--more-tokenizer", nargs="?", const="frame_tokenizer_r2", default=None, metavar="CONFIG",
                   help="with --design v2: the shipped frame tokenizer continued on WORK/corpus_v3 (configs/CONFIG.yaml, "
                        "default frame_tokenizer_r2; frame_tokenizer_voices: heard in other voices too; "
                        "frame_tokenizer_flite: with three of flite's voices, needs Debian's flite; "
                        "frame_tokenizer_kokoro: and four Kokoro voices, with the tools environment's Kokoro)")
    p.add_argument("--voices-flow", action="store_true",
                   help="with --design v2: a flow round on joe's second corpus plus three flite voices "
                        "(configs/flow_phoneme_voices.yaml; measured, not shipped: docs/cadenza-tiny.md)")
    p.add_argument("--speed-flow", action="store_true",
                   help="with --design v2: two flow rounds on speaking-rate pairs, audio read 0.5-2.1x as fast as its "
                        "tokens (configs/flow_phoneme_speed.yaml, flow_phoneme_speed_fast.yaml), for speed_method='flow'")
    p.add_argument("--long-hift", nargs="?", const="hift_joe_average", default=None, metavar="CONFIG",
                   choices=("hift_joe_average", "hift_joe_pitch", "hift_joe_even_r2"),
                   help="with --design v2: the shipped HiFT continued as a long GAN on WORK/corpus_v3 with its weights' "
                        "moving average exported (configs/hift_joe_average.yaml, the shipped round; hift_joe_pitch: "
                        "speed-perturbed crops and frame-period discriminators; hift_joe_even_r2: the shipped "
                        "buzz-free vocoder with fresh discriminators)")
    p.add_argument("--phone-hift", action="store_true",
                   help="with --design v2: the pitch round to step 3,000, then continued with the phone loss "
                        "(configs/hift_joe_phone.yaml, the shipped frame tokenizer listening for the words)")
    p.add_argument("--even-hift", action="store_true",
                   help="with --design v2: the phone round's checkpoint continued with its first upsampler held to "
                        "equal phase gains, no 50 Hz buzz (configs/hift_joe_even.yaml; after --phone-hift)")
    p.add_argument("--phase-hift", action="store_true",
                   help="with --design v2: the shipped vocoder continued (hift_joe_even_r2) to step 2,000, then with "
                        "the instantaneous-frequency loss to step 4,000 (configs/hift_joe_phase.yaml)")
    a = p.parse_args()
    recipe = Recipe(a.work, a.tools_python, a.threads, a.scale)
    if a.design == "v1" or a.v1_model is None:
        recipe.all(a.install and a.design == "v1")
    if a.design == "v2":
        recipe.v2(a.install, a.v1_model, a.from_shipped, a.more_flow, a.more_hift, a.rates_flow, a.flow_mel_hift,
                  a.more_tokenizer, a.voices_flow, a.speed_flow, a.long_hift, a.phone_hift,
                  a.even_hift, a.phase_hift)


if __name__ == "__main__":
    main()
