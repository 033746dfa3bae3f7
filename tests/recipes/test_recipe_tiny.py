"""Pieces of recipes/tiny that run without the teacher synthesizers: the text BPE in the Qwen2 file format and the
per-run stage configs (WORK substituted, steps scaled)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_tiny_{name}", RECIPE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_text_tokenizer_round_trips_and_fits_the_lm_vocabulary(tmp_path):
    from cadenza.text.qwen_tokenizer import CosyVoice2Tokenizer

    texts = ["God saw the light, and saw that it was good.", "Darkness was on the surface of the deep.",
             "They walked together along the river until the sun went down."] * 30
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"audio": f"{i}.wav", "text": t}) + "\n" for i, t in enumerate(texts)))
    n = _module("text_tokenizer").train_text_tokenizer(manifest, tmp_path / "tok", vocab_size=300)
    assert 256 <= n <= 300
    tok = CosyVoice2Tokenizer(tmp_path / "tok")
    lm_vocab = yaml.safe_load((RECIPE / "configs" / "lm.yaml").read_text())["model"]["qwen"]["vocab_size"]
    assert tok.vocab_size <= lm_vocab  # every id (BPE + the CosyVoice special tokens) indexes the LM's table
    for text in ("The river went down.", "Unseen words: zebra, quixotic."):
        ids = tok.encode(text)
        assert tok.decode(ids) == text and max(ids) < tok.vocab_size
    assert len(tok.encode("[laughter]")) == 1


def test_stage_configs_substitute_work_and_scale_steps(tmp_path):
    recipe = _module("run").Recipe(tmp_path, sys.executable, threads=1, scale=0.1)
    (tmp_path / "configs").mkdir()
    for name in ("tokenizer", "speaker", "lm", "flow", "hift", "hift_refine", "hift_gan", "tokenizer_v2", "lm_v2",
                 "flow_v2"):
        original = yaml.safe_load((RECIPE / "configs" / f"{name}.yaml").read_text())
        written = yaml.safe_load(recipe.config(name).read_text())
        assert written["train"]["max_steps"] == max(1, round(original["train"]["max_steps"] * 0.1))
        assert "WORK/" not in json.dumps(written)
        if "adversarial_start" in original.get("hift", {}):
            assert written["hift"]["adversarial_start"] == round(original["hift"]["adversarial_start"] * 0.1)
    lm = yaml.safe_load(recipe.config("lm").read_text())
    assert lm["model"]["tokenizer"] == f"{tmp_path.resolve()}/text_tokenizer"
    refine = yaml.safe_load(recipe.config("hift_refine").read_text())
    assert refine["hift"]["init_hift"] == f"{tmp_path.resolve()}/runs/hift"
    # The second round starts from the first round's exports.
    assert yaml.safe_load(recipe.config("lm_v2").read_text())["lm"]["init_llm"] == f"{tmp_path.resolve()}/runs/lm"
    assert yaml.safe_load(recipe.config("flow_v2").read_text())["flow"]["init_flow"] == f"{tmp_path.resolve()}/runs/flow"
    # v2: the phoneme LM from scratch, its flow from the v1 flow with a new embedding, the next flow round from it.
    flow_p = yaml.safe_load(recipe.config("flow_phoneme").read_text())["flow"]
    assert flow_p["init_flow"] == f"{tmp_path.resolve()}/runs/flow_v3" and flow_p["init_reinit"] == ["input_embedding."]
    r2 = yaml.safe_load(recipe.config("flow_phoneme_r2").read_text())["flow"]
    assert r2["init_flow"] == f"{tmp_path.resolve()}/runs/flow_phoneme" and r2["init_reinit"] == []
    # --more-hift continues the vocoder shipped in the package (a model folder: the stage reads its hift.pt).
    hift_joe = yaml.safe_load(recipe.config("hift_joe").read_text())["hift"]
    shipped = RECIPE.parents[1] / "src" / "cadenza" / "assets" / "cadenza-tiny"
    assert Path(hift_joe["init_hift"]) == shipped and (shipped / "hift.pt").is_file()
    assert hift_joe["adversarial_start"] == 0
    # The v2 vocoder round's two parts: from v1's HiFT (runs/hift_gan), then from the first part's export.
    tfv = yaml.safe_load(recipe.config("hift_joe_tfv").read_text())["hift"]
    tf_gan = yaml.safe_load(recipe.config("hift_joe_tf_gan").read_text())["hift"]
    assert tfv["init_hift"] == f"{tmp_path.resolve()}/runs/hift_gan" and tfv["source_f0"] == "target"
    assert tf_gan["init_hift"] == f"{tmp_path.resolve()}/runs/hift_joe_tfv" and tf_gan["adversarial_start"] == 0
    # The rates round starts from the newest finished flow round: the first (or shipped) one, then the second.
    rates = yaml.safe_load(recipe.config("flow_phoneme_rates").read_text())["flow"]
    assert rates["init_flow"] == f"{tmp_path.resolve()}/runs/flow_phoneme"
    (tmp_path / "runs" / "flow_phoneme_r2").mkdir(parents=True)
    assert yaml.safe_load(recipe.config("flow_phoneme_rates").read_text())["flow"]["init_flow"].endswith("flow_phoneme")
    (tmp_path / "runs" / "flow_phoneme_r2" / "done").write_text("ok\n")
    rates = yaml.safe_load(recipe.config("flow_phoneme_rates").read_text())["flow"]
    assert rates["init_flow"] == f"{tmp_path.resolve()}/runs/flow_phoneme_r2"
    # The vocoder fine-tune on the flow's mels continues the shipped vocoder and reads the stored flow_mel.
    flowmel = yaml.safe_load(recipe.config("hift_joe_flowmel").read_text())["hift"]
    assert Path(flowmel["init_hift"]) == shipped and flowmel["input_mel"] == "flow"
    # The long GAN round (--long-hift) continues the shipped vocoder and exports its weights' moving average.
    long_gan = yaml.safe_load(recipe.config("hift_joe_average").read_text())["hift"]
    assert Path(long_gan["init_hift"]) == shipped and 0 < long_gan["average_decay"] < 1
    # Its pitch-following variant (--long-hift hift_joe_pitch): the same start, speed-perturbed crops, frame periods.
    pitch = yaml.safe_load(recipe.config("hift_joe_pitch").read_text())["hift"]
    assert Path(pitch["init_hift"]) == shipped and pitch["speed_perturb"] == [0.7, 1.6]
    assert {240, 480} <= set(pitch["discriminator"]["periods"])
    # The phone round (--phone-hift): the pitch round's settings plus the phone loss, the shipped tokenizer listening.
    phone = yaml.safe_load(recipe.config("hift_joe_phone").read_text())["hift"]
    assert Path(phone["phone_model"]) == shipped and (shipped / "speech_tokenizer.json").is_file()
    assert phone["loss"]["phone_feature_weight"] > 0 and phone["loss"]["phone_posterior_weight"] > 0
    assert {k: v for k, v in phone.items() if k not in ("phone_model", "loss")} == \
        {k: v for k, v in pitch.items() if k != "loss"}
    # The buzz-free round (--even-hift): the phone round's settings with ups.0 held to equal phase gains.
    even = yaml.safe_load(recipe.config("hift_joe_even").read_text())["hift"]
    assert even["even_upsample_gain"] == [0] and even["discriminator_bf16"] is True
    assert {k: v for k, v in even.items() if k not in ("even_upsample_gain", "discriminator_bf16")} == phone
    # Its continuation from the shipped weights (--long-hift hift_joe_even_r2), and the phase round that resumes that
    # run's step-2,000 checkpoint (--phase-hift): the same settings, plus the instantaneous-frequency loss.
    r2 = yaml.safe_load(recipe.config("hift_joe_even_r2").read_text())["hift"]
    assert Path(r2["init_hift"]) == shipped and r2["discriminator_warmup"] > 0 and r2["even_upsample_gain"] == [0]
    phase = yaml.safe_load(recipe.config("hift_joe_phase").read_text())["hift"]
    assert phase["loss"].pop("phase_weight") > 0 and phase == r2
    # The frame tokenizer rounds continue the shipped tokenizer (a model folder holding its two files).
    for name in ("frame_tokenizer_r2", "frame_tokenizer_voices"):
        tok = yaml.safe_load(recipe.config(name).read_text())["frame_tokenizer"]
        assert Path(tok["init_tokenizer"]) == shipped and (shipped / "speech_tokenizer.safetensors").is_file()
    assert yaml.safe_load(recipe.config("frame_tokenizer_voices").read_text())["frame_tokenizer"]["augment"]["probability"] > 0
    voices = yaml.safe_load(recipe.config("flow_phoneme_voices").read_text())["flow"]
    assert voices["init_flow"] == f"{tmp_path.resolve()}/runs/flow_phoneme_r2" and voices["prior_weight"] == 0.5
    lm_p = yaml.safe_load(recipe.config("lm_phoneme").read_text())
    assert "init_llm" not in lm_p["lm"] and lm_p["train"]["mixed_precision"] == "auto"
    assert lm_p["model"]["overrides"]["llm"]["speech_token_size"] == 3 * 151


def test_hift_rounds_run_in_turn_and_the_last_is_the_one_packaged(tmp_path, monkeypatch):
    recipe = _module("run").Recipe(tmp_path, sys.executable, threads=1, scale=1.0)
    started, waited = [], []

    def train(stage, name, data, config=None, max_steps=None):
        assert stage == "hift" and data == "data_p" and max_steps is None
        assert all(p in waited for p in started), "a round started before the one before it ended"
        if (tmp_path / "runs" / name / "done").is_file():
            return None
        started.append((name, config))
        return (name, config)

    monkeypatch.setattr(recipe, "train", train)
    monkeypatch.setattr(recipe, "wait", lambda *procs: waited.extend(procs))
    (tmp_path / "runs" / "hift_joe_tfv").mkdir(parents=True)
    (tmp_path / "runs" / "hift_joe").mkdir()
    recipe.hift_rounds(["hift_joe_tfv", "hift_joe_tf_gan"])
    assert started == [("hift_joe_tfv", "hift_joe_tfv"), ("hift_joe", "hift_joe_tf_gan")]
    assert (tmp_path / "runs" / "hift_joe" / "done").is_file() and (tmp_path / "runs" / "hift_joe_tfv" / "done").is_file()
    started.clear()
    recipe.hift_rounds(["hift_joe_tfv", "hift_joe_tf_gan"])  # both done: nothing runs again
    assert started == []


def test_second_round_continues_the_newest_checkpoint_and_packages_the_newest_round(tmp_path):
    recipe = _module("run").Recipe(tmp_path, sys.executable, threads=1, scale=1.0)
    first = tmp_path / "runs" / "tokenizer" / "checkpoints"
    first.mkdir(parents=True)
    for step in (600, 700, 95):  # numeric order, not lexicographic ("step_95" > "step_700" as text)
        (first / f"step_{step}.pt").write_bytes(str(step).encode())
    recipe.continue_run("tokenizer", "tokenizer_v2")
    seeded = sorted((tmp_path / "runs" / "tokenizer_v2" / "checkpoints").iterdir())
    assert [p.name for p in seeded] == ["step_700.pt"] and seeded[0].read_bytes() == b"700"
    (first / "step_800.pt").write_bytes(b"800")
    recipe.continue_run("tokenizer", "tokenizer_v2")  # already seeded: the run's own checkpoints win
    assert [p.name for p in (tmp_path / "runs" / "tokenizer_v2" / "checkpoints").iterdir()] == ["step_700.pt"]

    newest_run = _module("package")._newest_run
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match="lm_v2"):
        newest_run(runs, "lm_v2", "lm")
    (runs / "lm").mkdir()
    (runs / "lm" / "done").write_text("ok\n")
    assert newest_run(runs, "lm_v2", "lm") == runs / "lm"
    (runs / "lm_v2").mkdir()
    assert newest_run(runs, "lm_v2", "lm") == runs / "lm"  # started but not finished
    (runs / "lm_v2" / "done").write_text("ok\n")
    assert newest_run(runs, "lm_v2", "lm") == runs / "lm_v2"


def test_packaging_takes_the_shipped_lineage_not_trial_rounds(tmp_path):
    """A finished trial round (measured, not kept) never displaces the round the shipped weights come from."""
    package = _module("package")
    runs = tmp_path / "runs"
    for name in ("flow_phoneme_r2", "flow_phoneme_rates", "flow_phoneme_voices", "hift_joe", "hift_joe_flowmel",
                 "frame_tokenizer", "frame_tokenizer_r2", "frame_tokenizer_voices"):
        (runs / name).mkdir(parents=True)
        (runs / name / "done").write_text("ok\n")
    assert package._newest_run(runs, *package.V2_FLOW_ROUNDS) == runs / "flow_phoneme_r2"
    assert package._newest_run(runs, *package.V2_HIFT_ROUNDS) == runs / "hift_joe"
    assert package._newest_run(runs, *package.V2_TOKENIZER_ROUNDS) == runs / "frame_tokenizer"
    (runs / "flow_phoneme_speed_fast").mkdir()
    (runs / "flow_phoneme_speed_fast" / "done").write_text("ok\n")
    assert package._newest_run(runs, *package.V2_FLOW_ROUNDS) == runs / "flow_phoneme_speed_fast"
    (runs / "hift_joe_average").mkdir()  # the long GAN round continues the shipped v2 vocoder round
    (runs / "hift_joe_average" / "done").write_text("ok\n")
    assert package._newest_run(runs, *package.V2_HIFT_ROUNDS) == runs / "hift_joe_average"
    (runs / "hift_joe_even").mkdir()  # the buzz-free round (shipped 2026-12-06) continues the phone round
    (runs / "hift_joe_even" / "done").write_text("ok\n")
    assert package._newest_run(runs, *package.V2_HIFT_ROUNDS) == runs / "hift_joe_even"


def test_training_curves_chain_each_stage_runs_on_one_step_axis(tmp_path):
    def write(run: str, steps: list[int], loss: float) -> None:
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": loss, "ctc_loss": loss}) + "\n" for s in steps))

    write("flow", [25, 50, 75, 50, 75, 100], 2.0)  # stopped at 75, resumed from its step-25 checkpoint
    write("flow_v2", [25, 50], 1.0)  # warm start: its own steps begin at 0
    write("tokenizer", [100, 200, 300], 3.0)
    write("tokenizer_v2", [225, 250, 400], 2.5)  # resumed from the step-200 checkpoint
    rows = _module("plot_curves")._rows
    assert [(r["step"], r["loss"]) for r in rows(tmp_path, "flow")] == [(25, 2.0), (50, 2.0), (75, 2.0), (100, 2.0),
                                                                        (125, 1.0), (150, 1.0)]
    assert [(r["step"], r["loss"]) for r in rows(tmp_path, "tokenizer")] == [(100, 3.0), (200, 3.0), (225, 2.5),
                                                                             (250, 2.5), (400, 2.5)]


def test_aligned_corpus_labels_every_phoneme_with_its_stress():
    """Piper's ids and durations -> one speech id per 40 ms frame: blanks join the phoneme before them, a stress mark
    (and its time) passes to the rest of its word, every phoneme keeps a frame, word spaces may vanish."""
    ac = _module("aligned_corpus")
    table = ["_", "^", "$", " ", ".", "ˈ", "h", "ə", "l", "o", "ʊ"]
    index = {s: i for i, s in enumerate(table)}
    s_count = len(table)
    # "həlˈoʊ." in Piper's layout, durations in units of 256 samples (882 samples = one 25 Hz frame = 3.445 units).
    seq = ["^", "_", "h", "_", "ə", "_", "l", "_", "ˈ", "_", "o", "_", "ʊ", "_", " ", "_", ".", "_", "$"]
    dur = np.array([3, 1, 1, 0, 4, 3, 3, 1, 4, 2, 1, 1, 2, 1, 1, 0, 9, 10, 4], dtype=np.float32)
    labels = ac.frame_labels(seq, dur, index)
    names = [("'" if k // s_count == 1 else "") + table[k % s_count] for k in labels]
    # Each phoneme is present, in order, with stress on the syllable after the mark and none after the word.
    runs = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert runs == ["^", "h", "ə", "l", "'o", "'ʊ", ".", "$"], names
    total = float(dur.sum()) * 256 / 882
    assert abs(len(labels) - total) <= 2  # the frames cover the audio (a forced frame may add one or two)
    assert max(labels) < 3 * s_count


def test_aligned_corpus_refuses_bad_rates_and_prefixes(tmp_path):
    """A second corpus (``--length-scale``, ``--id-prefix``) is checked before anything is rendered."""
    ac = _module("aligned_corpus")
    with pytest.raises(SystemExit, match="--length-scale 1.2 0.5"):
        ac.build(tmp_path, 10, 1, 0, (1.2, 0.5))
    with pytest.raises(SystemExit, match="--length-scale 0.1 1.0"):
        ac.build(tmp_path, 10, 1, 0, (0.1, 1.0))
    for prefix in ("joe-1", "everyday_x", "a/b"):
        with pytest.raises(SystemExit, match="--id-prefix"):
            ac.build(tmp_path, 10, 1, 0, (0.5, 1.2), prefix)
    assert not any(tmp_path.iterdir())  # nothing written


def test_vocoder_subset_copies_minutes_of_a_corpus_as_flac(tmp_path, monkeypatch):
    """recipes/tiny/vocoder_subset.py: whole utterances until the minutes are reached, as 24 kHz FLAC in the manifest
    layout that ``cadenza train hift`` reads, sample for sample (16-bit)."""
    import soundfile as sf

    from cadenza.training.wav_manifest import open_utterances

    corpus = tmp_path / "corpus"
    (corpus / "wavs").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(5):
        sf.write(corpus / "wavs" / f"{i}.wav", (0.1 * rng.standard_normal(24000)).astype(np.float32), 24000)
        rows.append(json.dumps({"audio": f"wavs/{i}.wav", "text": "x", "id": f"u{i}"}))
    (corpus / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "subset"
    monkeypatch.setattr(sys, "argv", ["vocoder_subset.py", "--data", str(corpus), "--minutes", "0.04", "--out", str(out)])
    _module("vocoder_subset").main()
    subset = open_utterances(out)
    assert len(subset) == 3  # 1 s each: the third reaches 2.4 s
    source = open_utterances(corpus)
    ids = {source.meta(i).id: i for i in range(len(source))}
    for i in range(len(subset)):
        wav, _ = subset.load(i, 24000)
        original, _ = source.load(ids[subset.meta(i).id], 24000)
        assert wav.shape == original.shape and float((wav - original).abs().max()) <= 1 / 32768 + 1e-6
    assert all(p.suffix == ".flac" for p in (out / "wavs").iterdir())


def test_flite_phone_timings_label_our_phonemes(monkeypatch):
    """flite_corpus.py: flite's timed ARPAbet phones become one label per 40 ms frame of our espeak phonemes (with
    stress), pauses only at the ends or word breaks; a phoneme flite does not say keeps one frame, a phone of flite's
    with no partner gives its time to the phoneme before it."""
    monkeypatch.syspath_prepend(str(RECIPE))  # it labels with aligned_corpus's rules, as the script does
    fc = _module("flite_corpus")
    symbols = ["^", "$", " ", ".", "h", "ə", "l", "o", "ʊ", "ɛ", "t", "ˈ"]
    index = {s: i for i, s in enumerate(symbols)}
    S = len(symbols)
    phones = [("pau", 0.2), ("hh", 0.28), ("ax", 0.36), ("l", 0.44), ("ow", 0.6), ("pau", 0.8)]
    labels, same = fc.frame_labels(["h", "ə", "l", "ˈ", "o", "ʊ", "."], phones, index, 20)
    # The closing pause matches the end ("$"); the full stop keeps its one frame.
    expect = ["^"] * 5 + ["h"] * 2 + ["ə"] * 2 + ["l"] * 2 + ["o'"] * 2 + ["ʊ'"] * 2 + ["."] + ["$"] * 4
    names = [symbols[x % S] + ("'" if x // S == 1 else "") for x in labels]
    assert names == expect and same == 1.0
    # "hello" said by flite with an extra t (no partner: its time goes to the l before it); our ɛ is not said by
    # flite (one frame of its own).
    phones = [("pau", 0.2), ("hh", 0.28), ("l", 0.36), ("t", 0.44), ("ow", 0.6), ("pau", 0.8)]
    labels, same = fc.frame_labels(["h", "ɛ", "l", "o", "ʊ", "."], phones, index, 20)
    names = [symbols[x % S] for x in labels]
    assert names[:5] == ["^"] * 5 and names[5:7] == ["h", "h"] and names[7] == "ɛ"
    assert names.count("l") == 4 - 1 and len(names) == 20  # l: its own 2 frames + t's 2, one given to ɛ's frame
    assert same == pytest.approx(4 / 5)  # h, l, o, ʊ of h ɛ l o ʊ


def test_kokoro_durations_label_our_phonemes(monkeypatch):
    """kokoro_corpus.py: Kokoro's per-phoneme durations (600 samples at 24 kHz) become one label per 40 ms frame,
    each phoneme ending where its durations add up to (and the stress mark's time going to its syllable)."""
    monkeypatch.syspath_prepend(str(RECIPE))
    kc = _module("kokoro_corpus")
    symbols = ["^", "$", " ", ".", "ˈ", "h", "a", "i"]
    index = {s: i for i, s in enumerate(symbols)}
    phonemes = ["h", "ˈ", "a", "i", "."]
    # units of 600 samples (0.625 of a 40 ms frame): ^ 4, h 4, ˈ 0, a 8, i 4, . 4, $ 0: the phonemes end at frames
    # 2.5, 5, 10, 12.5 and 15 (rounded half to even: 2 and 12), "$" keeps a frame past the audio's 15 and is cut
    durations = np.array([4, 4, 0, 8, 4, 4, 0], dtype=np.float64)
    labels = kc.kokoro_labels(phonemes, durations, index, tokens=15)
    S = len(symbols)
    assert labels == ([index["^"]] * 2 + [index["h"]] * 3 + [S + index["a"]] * 5 + [S + index["i"]] * 2
                      + [index["."]] * 3), labels
    assert len(kc.kokoro_labels(phonemes, durations, index, tokens=17)) == 17  # audio a little longer: padded


def test_corpus_preparation_and_extraction_run_once(tmp_path, monkeypatch):
    """aligned_data / flite_data: prepare the corpus's manifest (two parts), extract labels (and x-vectors) into the
    data folder, each step once: a second call runs nothing."""
    run = _module("run")
    recipe = run.Recipe(tmp_path, sys.executable, threads=1, scale=1.0)
    ran, started = [], []

    def start(cmd, log_name):
        started.append(cmd)
        (tmp_path / "data_x").mkdir(exist_ok=True)
        (tmp_path / "data_x" / "index.jsonl").write_text("")  # what prepare leaves behind
        return cmd

    monkeypatch.setattr(recipe, "run", lambda cmd, log_name: ran.append(cmd))
    monkeypatch.setattr(recipe, "start", start)
    monkeypatch.setattr(recipe, "wait", lambda *procs: None)
    (tmp_path / "corpus_x").mkdir()
    (tmp_path / "corpus_x" / "arrays.jsonl").write_text("")  # rendered already: no corpus step
    recipe.aligned_data("corpus_x", "data_x")
    assert len(started) == 2 and all(str(tmp_path / "corpus_x" / "manifest.jsonl") in c for c in started)
    assert ["--part", "1"] == started[1][started[1].index("--part"):][:2]
    (extract,) = ran
    extractors = [extract[i + 1] for i, a in enumerate(extract) if a == "--extractor"]
    assert extractors == [f"{run.ARRAYS_EXTRACTOR}={tmp_path / 'corpus_x' / 'arrays.jsonl'}",
                          f"{run.SPEAKER_EXTRACTOR}={tmp_path / 'runs' / 'speaker'}"]
    assert (tmp_path / "data_x" / "extracted.ok").is_file()
    recipe.aligned_data("corpus_x", "data_x")
    recipe.extract_once("data_x", "extracted.ok", "again", "x:y=z")
    assert len(started) == 2 and len(ran) == 1


def test_phone_round_resumes_the_pitch_round_at_step_3000(tmp_path, monkeypatch):
    """--phone-hift: the pitch round stopped at 3,000 steps (scaled), its newest checkpoint seeds the phone round."""
    recipe = _module("run").Recipe(tmp_path, sys.executable, threads=1, scale=0.5)
    commands = []

    def start(cmd, name):
        commands.append((name, cmd))
        ckpts = tmp_path / "runs" / name / "checkpoints"
        ckpts.mkdir(parents=True, exist_ok=True)
        if name == "hift_joe_pitch_3000":
            for step in (1000, 1500):
                (ckpts / f"step_{step}.pt").write_bytes(str(step).encode())
        return name

    monkeypatch.setattr(recipe, "start", start)
    monkeypatch.setattr(recipe, "wait", lambda *procs: None)
    (tmp_path / "configs").mkdir()
    recipe.train_through("hift", "hift_joe_pitch_3000", "data_q", config="hift_joe_pitch", max_steps=3000)
    recipe.continue_run("hift_joe_pitch_3000", "hift_joe_phone")
    recipe.train_through("hift", "hift_joe_phone", "data_q")
    (first, pitch_cmd), (second, phone_cmd) = commands
    assert first == "hift_joe_pitch_3000" and pitch_cmd[pitch_cmd.index("--max-steps") + 1] == "1500"
    assert pitch_cmd[pitch_cmd.index("--config") + 1].endswith("hift_joe_pitch.yaml")
    assert second == "hift_joe_phone" and "--resume" in phone_cmd and "--max-steps" not in phone_cmd
    seeded = tmp_path / "runs" / "hift_joe_phone" / "checkpoints"
    assert [p.name for p in seeded.glob("step_*.pt")] == ["step_1500.pt"]


def test_vocoder_bands_swap_exactly_the_band_below_the_split():
    """Each swapped signal holds one source's spectrum below the split and the other's above it (tones at 500 Hz
    and 5 kHz, one per source, land where they should), and the two swaps add back to the two sources."""
    bands = _module("vocoder_bands")
    sr, n = 24000, 24000
    t = np.arange(n) / sr
    teacher = np.sin(2 * np.pi * 500 * t) + np.sin(2 * np.pi * 5000 * t)
    vocoder = 0.5 * np.sin(2 * np.pi * 500 * t) + 0.25 * np.sin(2 * np.pi * 5000 * t)
    out = bands.band_swaps(teacher, vocoder, sr, [2000.0])
    low_teacher = out["teacher below 2000 Hz, vocoder above"]
    low_vocoder = out["vocoder below 2000 Hz, teacher above"]
    spectrum = np.abs(np.fft.rfft(low_teacher)) / (n / 2)
    assert spectrum[500] == pytest.approx(1.0, abs=1e-6) and spectrum[5000] == pytest.approx(0.25, abs=1e-6)
    spectrum = np.abs(np.fft.rfft(low_vocoder)) / (n / 2)
    assert spectrum[500] == pytest.approx(0.5, abs=1e-6) and spectrum[5000] == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(low_teacher + low_vocoder, teacher + vocoder, atol=1e-9)
    assert set(out) >= {"teacher", "vocoder"} and len(out) == 4


def test_vocoder_bands_swap_magnitude_and_phase_below_the_split():
    """Below the split one signal's magnitude goes with the other's phase (a 500 Hz tone comes out with the
    amplitude of one source and the phase of the other), above it the teacher's spectrum is kept (its 5 kHz tone),
    in both directions."""
    bands = _module("vocoder_bands")
    sr, n = 24000, 24000
    t = np.arange(n) / sr
    high = np.sin(2 * np.pi * 5000 * t)
    teacher = np.sin(2 * np.pi * 500 * t + 0.3) + high
    vocoder = 0.5 * np.sin(2 * np.pi * 500 * t + 1.7) + 0.25 * np.sin(2 * np.pi * 5000 * t)
    out = bands.magnitude_phase_swaps(teacher, vocoder, sr, [2000.0])
    assert len(out) == 2
    middle = slice(2048, n - 2048)  # away from the ends, which the STFT frames cover only partly
    expected = {"below 2000 Hz vocoder magnitude, teacher phase": 0.5 * np.sin(2 * np.pi * 500 * t + 0.3) + high,
                "below 2000 Hz teacher magnitude, vocoder phase": np.sin(2 * np.pi * 500 * t + 1.7) + high}
    for name, signal in expected.items():
        np.testing.assert_allclose(out[name][middle], signal[middle], atol=1e-4, err_msg=name)
