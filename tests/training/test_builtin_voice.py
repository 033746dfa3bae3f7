"""Your voice on the built-in model (docs/training.md): a corpus prepared with the built-in cadenza-tiny's own frontend
(``--model cadenza-tiny``), its flow and vocoder fine-tuned from the shipped weights with the shipped configs, and
``cadenza assemble --base cadenza-tiny --voice`` making a folder whose default voice is the recording's.

The corpus is the built-in model's own speech, pitched up a fifth by resampling (another voice, made offline);
the training runs are a few steps: this checks the path, not the quality (the measured run is in docs/training.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import cadenza
from cadenza.audio.resample import resample
from cadenza.builtin import builtin_model_dir
from cadenza.cli.main import main as cli_main
from cadenza.data.dataset import ShardDataset
from cadenza.data.prepare import prepare
from cadenza.errors import CadenzaError, InputError
from cadenza.loading import read_torch_state_dict
from cadenza.training.config import load_config_file
from cadenza.training.launcher import train
from helpers import one_torch_thread

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "train"
SENTENCES = ("The kettle is on the stove.", "We walked to the station together.", "Please close the window.",
             "Her garden has seven tall trees.", "The museum opens at nine.", "He bought bread and cheese.",
             "It rained all afternoon.", "They painted the fence green.")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Eight utterances in a voice a fifth above the built-in one (24 kHz renderings played at 36 kHz)."""
    root = tmp_path_factory.mktemp("my_voice")
    tts = cadenza.load()
    rows = []
    with one_torch_thread():
        for i, text in enumerate(SENTENCES):
            audio = tts.synthesize(text, seed=i)
            higher = resample(torch.from_numpy(audio.samples), 36000, 24000).numpy()
            sf.write(root / f"u{i}.wav", higher, 24000)
            rows.append({"id": f"u{i}", "audio": f"u{i}.wav", "text": text, "speaker": "me"})
    tts.close()
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def prepared(corpus: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("my_voice_data")
    with one_torch_thread():
        summary = prepare(corpus / "manifest.jsonl", "jsonl", out, model_dir="cadenza-tiny", shard_size=4,
                          progress=False)
    assert summary["accepted"] == len(SENTENCES), summary
    return out


def test_prepare_with_the_builtin_frontend_gives_what_inference_reads(corpus: Path, prepared: Path):
    """X-vectors and phoneme ids are those the built-in model computes for the same audio and text (its trained
    speaker encoder and phoneme table; not the release's ONNX files and BPE); speech tokens are its frame
    classifier's labels placed by alignment with the transcript (the classifier's own guesses are poor for a voice
    it never heard), the same length as the tokens it computes."""
    from cadenza.alignment.aligner import PhonemePosteriors
    from cadenza.alignment.speech_labels import aligned_labels

    tts = cadenza.load()
    frontend = tts.engine.frontend
    posteriors = PhonemePosteriors()
    data = ShardDataset(prepared, ("speech_tokens", "spk_emb", "text_ids", "mel"))
    assert len(data) == len(SENTENCES)
    with one_torch_thread():
        for i in (0, 5):
            item = data[i]
            wav, sr = sf.read(corpus / f"u{i}.wav", dtype="float32")
            wav16k = resample(torch.from_numpy(wav), sr, 16000)
            ids = frontend.text_ids(SENTENCES[i])[0]
            expect = aligned_labels(posteriors(wav16k.numpy()), ids.tolist(), posteriors.symbols)
            assert item["speech_tokens"].long().tolist() == expect.tolist()
            assert abs(item["speech_tokens"].numel() - frontend.speech_tokens(wav16k).shape[1]) <= 1
            assert torch.allclose(item["spk_emb"], frontend.speaker_embedding(wav16k)[0], atol=1e-5)
            assert torch.equal(item["text_ids"].long(), frontend.text_ids(SENTENCES[i])[0])
            # phoneme ids, about two speech tokens each: the LM's own limits (0.5-4), not the release's 2-20
            ratio = item["speech_tokens"].numel() / item["text_ids"].numel()
            assert 0.5 <= ratio <= 4.0
    tts.close()


def _fine_tune(stage: str, data: Path, out: Path, **section) -> Path:
    config = load_config_file(CONFIGS / f"{stage}_tiny_voice.yaml")
    train_section = {**config["train"], "batch_size": 2, "log_every": 1, "ckpt_every": 100}
    stage_section = {**config[stage], **section}
    with one_torch_thread():
        return train(stage, CONFIGS / f"{stage}_tiny_voice.yaml", data, out, max_steps=3,
                     config_overrides={"train": train_section, stage: stage_section})


def test_fine_tuned_folder_speaks_with_the_new_default_voice(corpus: Path, prepared: Path, tmp_path: Path):
    flow_run = _fine_tune("flow", prepared, tmp_path / "flow")
    hift_run = _fine_tune("hift", prepared, tmp_path / "hift", discriminator_warmup=1)
    shipped = read_torch_state_dict(builtin_model_dir() / "flow.pt")
    tuned = read_torch_state_dict(flow_run / "flow.pt")
    assert shipped.keys() == tuned.keys()
    assert any(not torch.equal(shipped[k].float(), tuned[k]) for k in shipped), "the flow did not train"

    folder = tmp_path / "my-tiny"
    prompt_text = SENTENCES[1]
    with one_torch_thread():
        assert cli_main(["assemble", str(flow_run), str(hift_run), "--base", "cadenza-tiny", "--out", str(folder),
                         "--voice", "me", "--prompt-wav", str(corpus / "u1.wav"), "--prompt-text", prompt_text]) == 0
    meta = json.loads((folder / "cadenza.json").read_text(encoding="utf-8"))
    assert meta["name"] == "my-tiny" and meta["default_speaker"] == "me"
    assert meta["lm_prompt"] is False  # carried from the base: the tiny LM learnt without prompts
    assert meta["speaker_prompts"]["me"] == prompt_text
    assert "flow, hift fine-tuned" in meta["recipe"] and "weights_dtype" not in meta
    assert (folder / "CosyVoice-BlankEN" / "phonemes.json").is_file()  # the phoneme frontend came along

    tts = cadenza.load(str(folder))
    try:
        assert set(tts.speakers) >= {"joe", "me"}
        with one_torch_thread():
            default = tts.synthesize("Good morning to you.", seed=3)
            as_me = tts.synthesize("Good morning to you.", speaker="me", seed=3)
            as_joe = tts.synthesize("Good morning to you.", speaker="joe", seed=3)
    finally:
        tts.close()
    np.testing.assert_array_equal(default.samples, as_me.samples)  # the default voice is the recording's
    assert not np.array_equal(default.samples, as_joe.samples)
    assert 0.3 < default.duration < 5.0 and np.isfinite(default.samples).all()
    assert np.sqrt(np.mean(default.samples ** 2)) > 1e-3


def test_flow_freeze_keeps_the_named_blocks_as_shipped(prepared: Path, tmp_path: Path):
    frozen = ("input_embedding.", "encoder.", "encoder_proj.")
    run = _fine_tune("flow", prepared, tmp_path / "flow", freeze=list(frozen), prior_weight=0.0)
    shipped = read_torch_state_dict(builtin_model_dir() / "flow.pt")
    tuned = read_torch_state_dict(run / "flow.pt")
    kept = [k for k in shipped if k.startswith(frozen)]
    assert kept and all(torch.equal(shipped[k].float(), tuned[k]) for k in kept)
    assert any(not torch.equal(shipped[k].float(), tuned[k]) for k in shipped if k.startswith("decoder."))
    with pytest.raises(InputError, match="flow.freeze prefixes match no parameter"):
        _fine_tune("flow", prepared, tmp_path / "bad", freeze=["encoder.nope."])


def test_assemble_refuses_bad_arguments(prepared: Path, tmp_path: Path, capsys):
    out = tmp_path / "m"
    assert cli_main(["assemble", str(prepared), "--base", "cadenza-tiny", "--out", str(out), "--voice", "me"]) == 2
    assert "--voice, --prompt-wav and --prompt-text go together" in capsys.readouterr().err
    out.mkdir()
    assert cli_main(["assemble", str(prepared), "--base", "cadenza-tiny", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    with pytest.raises((InputError, CadenzaError)):
        from cadenza.training.export import assemble_model_dir

        assemble_model_dir(tmp_path / "missing", out=tmp_path / "n", base="cadenza-tiny")


def test_assemble_refuses_a_run_that_gives_nothing(tmp_path: Path):
    """A run stopped before its export (checkpoints only), its checkpoints folder, or an empty folder: refused naming
    it and what to do, where it was assembled with the base's weights in its place ("its nothing fine-tuned")."""
    from cadenza.training.export import assemble_model_dir

    stopped = tmp_path / "runs" / "flow"
    (stopped / "checkpoints").mkdir(parents=True)
    (stopped / "checkpoints" / "step_4.pt").write_bytes(b"x")
    empty = tmp_path / "runs" / "empty"
    empty.mkdir()
    for run, says in ((stopped, "the run stopped before its export"),
                      (stopped / "checkpoints", "give the run folder"), (empty, "holds no component")):
        with pytest.raises(InputError, match=says):
            assemble_model_dir(run, out=tmp_path / "model", base="cadenza-tiny", verify=False)
        assert not (tmp_path / "model").exists()


def test_the_lm_stages_start_from_the_built_in_folder(tmp_path: Path):
    """``model: {dir: cadenza-tiny}`` (as the voice recipes' configs say it) for the LM / DPO stages: its phoneme table
    is the text tokenizer (it was read as BPE files and refused: "vocab.json missing"); speaker tags need BPE."""
    from cadenza.text.phonemes import PhonemeTokenizer
    from cadenza.training.lm_stage import LMStage

    config = {"train": {"batch_size": 2, "max_steps": 1}, "model": {"dir": "cadenza-tiny"},
              "lm": {"init_llm": "cadenza-tiny"}}
    stage = LMStage(config, tmp_path)
    assert isinstance(stage.tokenizer, PhonemeTokenizer) and stage.tokenizer.encode("Hello.")
    with pytest.raises(InputError, match="this model reads phonemes: train without speaker_tags"):
        LMStage({**config, "lm": {"speaker_tags": True}}, tmp_path)
