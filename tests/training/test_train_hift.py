"""HiFT GAN training: the YIN f0 tracker, discriminators and losses, the "hift" stage end to end on synthetic
harmonic audio, and the export of a release-layout hift.pt that the normal loaders read."""

from __future__ import annotations

import json
import math

import pytest
import soundfile as sf
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.pitch import yin_f0
from cadenza.errors import CheckpointError, InputError
from cadenza.layers.weight_norm import fold_weight_norm, weight_norm_key_shapes
from cadenza.loading import load_into
from cadenza.models.cosyvoice2.config import CosyVoice2Config, HiFTConfig
from cadenza.models.cosyvoice2.hift import HiFTGenerator
from cadenza.models.cosyvoice2.nsf_source import draw_source_noise
from cadenza.training.hift.data import crop_batch
from cadenza.training.hift.weight_norm_io import apply_weight_norm, release_state_dict
from cadenza.training.hift_stage import EXPORT_NAME, HiFTStage
from helpers import one_torch_thread
from hift_training_data import CONFIG, SR, harmonic

TINY_G = {"base_channels": 16, "f0_cond_channels": 16}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


# ---------------------------------------------------------------------------------------------- pitch


@pytest.mark.parametrize("f0", [80.0, 100.0, 150.0, 220.0, 330.0, 440.0, 600.0])
def test_yin_tracks_steady_tones(f0):
    t = torch.arange(SR) / SR
    for wav in (torch.sin(2 * math.pi * f0 * t), harmonic(torch.full((SR,), f0), 11)):
        track = yin_f0(wav, SR, 480)
        assert track.shape == (SR // 480,)
        assert ((track - f0).abs() / f0).max() < 5e-3  # measured: < 1e-3 (sub-sample parabolic refinement)


def test_yin_follows_a_glide_and_rejects_noise_and_silence():
    t = torch.arange(SR) / SR
    f0 = 100 + 200 * t  # 100 -> 300 Hz in one second
    track = yin_f0(harmonic(f0), SR, 480, n_frames=50)
    centres = (torch.arange(50) * 480 + 240) / SR  # mel frame centres
    expected = 100 + 200 * centres
    assert ((track - expected).abs() / expected).max() < 0.02
    noise = torch.randn(SR, generator=torch.Generator().manual_seed(0))
    assert (yin_f0(noise, SR, 480) == 0).float().mean() > 0.9
    assert (yin_f0(torch.zeros(SR), SR, 480) == 0).all()
    half = torch.cat([harmonic(torch.full((SR // 2,), 200.0)), torch.zeros(SR // 2)])
    track = yin_f0(half, SR, 480)
    assert (track[:20] > 0).all() and (track[30:] == 0).all()


# ---------------------------------------------------------------------------------------------- parts


def test_release_export_round_trips_both_ways():
    torch.manual_seed(0)
    cfg = HiFTConfig(**TINY_G)
    plain = HiFTGenerator(cfg)
    names = plain.weight_norm_module_names()
    expected = weight_norm_key_shapes({k: v.shape for k, v in plain.state_dict().items()}, names)
    exported = release_state_dict(plain)  # unfolds plain convs into g / v
    assert list(exported) == list(expected)
    assert all(exported[k].shape == s for k, s in expected.items())
    folded = fold_weight_norm(exported)
    for k, v in plain.state_dict().items():
        assert torch.allclose(folded[k], v, rtol=1e-6, atol=1e-7), k

    normed = apply_weight_norm(HiFTGenerator(cfg))
    exported = release_state_dict(normed)  # already parametrised: the state dict is the release layout
    assert list(exported) == list(expected)
    reloaded = HiFTGenerator(cfg)
    reloaded.load_reference_state_dict(exported)
    mel = torch.randn(1, 80, 6)
    noise = draw_source_noise(1, 6 * cfg.hop_length, cfg.nb_harmonics + 1, torch.Generator().manual_seed(3))
    with torch.no_grad():
        # torch's fused weight-norm kernel and the loader's fold differ by float rounding (~1e-9 on weights).
        assert torch.allclose(reloaded(mel, noise=noise)[0], normed(mel, noise=noise)[0], atol=1e-6)


# ---------------------------------------------------------------------------------------------- stage


def test_hift_stage_trains_and_exports_a_loadable_hift_pt(hift_corpus, tmp_path):
    torch.manual_seed(0)
    stage = HiFTStage(CONFIG, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    assert stage.model_cfg == HiFTConfig(**TINY_G)
    dataset = stage.dataset()
    item = dataset[0]
    assert item["f0"].shape == (item["wav"].shape[0] // 480,) and (item["f0"][:30] > 100).all()  # 0.7 s voiced
    crops = crop_batch([item, dataset[1]], 2880, 480, 9, seed=5, step=3)
    assert crops.speech.shape == (2, 2880) and crops.f0.shape == (2, 6) and crops.sine_noise.shape == (2, 2880, 9)
    again = crop_batch([item, dataset[1]], 2880, 480, 9, seed=5, step=3)
    assert torch.equal(again.speech, crops.speech) and torch.equal(again.sine_noise, crops.sine_noise)

    loader = torch.utils.data.DataLoader(dataset, batch_size=3, shuffle=True, collate_fn=stage.collate,
                                         drop_last=True)
    metrics: list[dict[str, float]] = []
    while len(metrics) < 14:
        for batch in loader:
            metrics.append(stage.train_step(batch, len(metrics)))
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["loss_d"]) for m in metrics)
    mel_first = sum(m["loss_mel"] for m in metrics[:3]) / 3
    mel_last = sum(m["loss_mel"] for m in metrics[-5:]) / 5
    assert mel_last < 0.7 * mel_first, (mel_first, mel_last)
    d_first = sum(m["loss_d"] for m in metrics[:3]) / 3
    d_last = sum(m["loss_d"] for m in metrics[-5:]) / 5
    assert d_last < d_first, (d_first, d_last)

    stage.export(tmp_path)
    written = CosyVoice2Config.from_files(tmp_path / "cosyvoice2.yaml", tmp_path / "CosyVoice-BlankEN" / "config.json")
    assert written.hift == stage.model_cfg
    state = torch.load(tmp_path / EXPORT_NAME, map_location="cpu", weights_only=True)
    assert any(k.endswith(".parametrizations.weight.original1") for k in state)
    cfg = HiFTConfig(**TINY_G)
    reloaded = HiFTGenerator(cfg).eval()
    reloaded.load_reference_state_dict(state)
    via_loader = HiFTGenerator(cfg).eval()  # the model loader's path (loader.py)
    load_into(via_loader, fold_weight_norm(state), "hift.pt")

    mel = flow_prompt_mel(crop_batch(batch[:1], 2880, 480, 9, 0, 0).speech, stage.mel_cfg)
    noise = draw_source_noise(1, mel.shape[-1] * cfg.hop_length, cfg.nb_harmonics + 1,
                              torch.Generator().manual_seed(7))
    stage.generator.eval()
    with torch.no_grad():
        trained = stage.generator(mel, noise=noise)[0]
        assert torch.allclose(reloaded(mel, noise=noise)[0], trained, atol=1e-6)
        assert torch.allclose(via_loader(mel, noise=noise)[0], trained, atol=1e-6)

        resumed = HiFTStage(CONFIG, hift_corpus)
        resumed.setup(torch.device("cpu"), lambda m: m)
        resumed.load_state_dict(stage.state_dict())
        resumed.generator.eval()
        assert torch.equal(resumed.generator(mel, noise=noise)[0], trained)

    # Fine-tuning starts from an exported file.
    warm = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "init_hift": str(tmp_path), "weight_norm": False}},
                     hift_corpus)
    warm.setup(torch.device("cpu"), lambda m: m)
    warm.generator.eval()
    with torch.no_grad():
        assert torch.allclose(warm.generator(mel, noise=noise)[0], trained, atol=1e-6)


def test_stage_config_errors(hift_corpus):
    with pytest.raises(InputError, match="unknown keys"):
        HiFTStage({**CONFIG, "hift": {"segment": 3}}, hift_corpus)
    with pytest.raises(InputError, match="unknown keys in hift.discriminator"):
        HiFTStage({**CONFIG, "hift": {"discriminator": {"channels": 3}}}, hift_corpus)
    with pytest.raises(InputError, match="multiple of"):
        HiFTStage({**CONFIG, "hift": {"segment_samples": 1000}}, hift_corpus)


def test_hift_stage_reads_a_prepared_corpus(hift_corpus, tmp_path):
    """The manifest folder is also a ``jsonl`` corpus: prepare it into shards (with f0) and train from those."""
    from cadenza.data.prepare import prepare
    from cadenza.training.wav_manifest import ShardSource

    with one_torch_thread():
        prepare(hift_corpus / "manifest.jsonl", "jsonl", tmp_path, progress=False)
    stage = HiFTStage(CONFIG, tmp_path)
    stage.setup(torch.device("cpu"), lambda m: m)
    dataset = stage.dataset()
    assert isinstance(dataset.source, ShardSource) and len(dataset) == 6
    assert dataset.source.meta(0).text == "a steady vowel" and dataset.source.meta(1).speaker in ("s0", "s1")
    item = dataset[0]
    stored = dataset.source.load(0, SR)[1]
    assert stored is not None and torch.equal(item["f0"], stored[: item["f0"].shape[0]])  # the stored track is used
    metrics = stage.train_step(stage.collate([dataset[i] for i in range(3)]), 0)
    assert math.isfinite(metrics["loss"])


def test_example_config_runs_through_the_launcher(hift_corpus, tmp_path, caplog):
    """``configs/train/hift_tiny.yaml`` is valid and its stage trains, checkpoints and exports via the launcher; asked
    for bf16, the stage still computes in float32 and the log says so (it used to claim bf16 autocast)."""
    import logging
    from pathlib import Path

    from cadenza.training.launcher import load_config_file, train

    config = Path(__file__).resolve().parents[2] / "configs" / "train" / "hift_tiny.yaml"
    with caplog.at_level(logging.INFO, logger="cadenza"):
        out = train("hift", config, hift_corpus, tmp_path, max_steps=2,
                    config_overrides={"train": {**load_config_file(config)["train"], "mixed_precision": "bf16"}})
    assert all((out / name).is_file() for name in ("hift.pt", "cosyvoice2.yaml"))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines and math.isfinite(json.loads(lines[-1])["loss"])
    assert "in float32 (mixed_precision=bf16; the hift stage always computes in float32)" in caplog.text


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _unchanged(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


def test_adversarial_start_trains_the_generator_alone_first(hift_corpus):
    """Before ``adversarial_start`` only the mel + f0 losses train the generator (the discriminator is untouched);
    from that step on the GAN turns run."""
    with one_torch_thread():
        torch.manual_seed(0)
        stage = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "adversarial_start": 3}}, hift_corpus)
        stage.setup(torch.device("cpu"), lambda m: m)
        d_before, g_before = _snapshot(stage.discriminator), _snapshot(stage.generator)
        batch = [stage.dataset()[i] for i in range(3)]
        warm = [stage.train_step(batch, step) for step in range(3)]
        assert all(m["loss_d"] == 0.0 and m["loss_adv"] == 0.0 and m["loss_mel"] > 0 for m in warm)
        assert _unchanged(stage.discriminator, d_before) and not _unchanged(stage.generator, g_before)
        gan = stage.train_step(batch, 3)
        assert gan["loss_d"] > 0 and gan["loss_adv"] > 0
        assert not _unchanged(stage.discriminator, d_before)
    with pytest.raises(InputError, match="adversarial_start"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "adversarial_start": -1}}, hift_corpus)


def test_discriminator_warmup_holds_the_generator_after_its_own_warmup(hift_corpus):
    """Generator warm-up first (``adversarial_start``), then ``discriminator_warmup`` steps in which only the
    discriminators train (the generator and its average stand still, its regression losses are still logged), then
    both: a fine-tuned vocoder meets discriminators that already tell it from real speech."""
    with one_torch_thread():
        torch.manual_seed(0)
        stage = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "adversarial_start": 1, "discriminator_warmup": 2,
                                              "average_decay": 0.9}}, hift_corpus)
        stage.setup(torch.device("cpu"), lambda m: m)
        batch = [stage.dataset()[i] for i in range(3)]
        first = stage.train_step(batch, 0)
        assert first["loss_d"] == 0.0 and first["grad_norm_g"] > 0
        g_held = _snapshot(stage.generator)
        avg_held = {k: v.clone() for k, v in stage.average.state_dict()["average"].items()}
        d_before = _snapshot(stage.discriminator)
        held = [stage.train_step(batch, step) for step in (1, 2)]
        assert all(m["loss_d"] > 0 and m["grad_norm_d"] > 0 for m in held)
        assert all(m["grad_norm_g"] == 0.0 and m["loss_adv"] == 0.0 and m["loss_mel"] > 0 for m in held)
        assert _unchanged(stage.generator, g_held)
        assert stage.average.state_dict()["updates"] == 1
        assert all(torch.equal(v, avg_held[k]) for k, v in stage.average.state_dict()["average"].items())
        assert not _unchanged(stage.discriminator, d_before)
        both = stage.train_step(batch, 3)
        assert both["loss_adv"] > 0 and both["grad_norm_g"] > 0
        assert not _unchanged(stage.generator, g_held)
    with pytest.raises(InputError, match="discriminator_warmup"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "discriminator_warmup": -1}}, hift_corpus)


def test_source_mix_reset_frozen_and_stft_loss_trains(hift_corpus):
    mix = [0.5, 0.25, 0.12, 0.06, 0.03, 0.0, 0.0, 0.0, 0.0]
    cfg = {**CONFIG, "hift": {**CONFIG["hift"], "source_mix": mix, "freeze_source_mix": True, "adversarial_start": 1,
                              "loss": {"stft_weight": 2.0, "periodic_weight": 5.0, "phase_weight": 3.0}}}
    torch.manual_seed(0)
    stage = HiFTStage(cfg, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    linear = stage.generator.m_source.l_linear
    assert torch.allclose(linear.weight, torch.tensor([mix])) and float(linear.bias) == 0
    batch = [stage.dataset()[i] for i in range(3)]
    metrics = [stage.train_step(batch, step) for step in range(2)]  # a warm-up step and a GAN step
    assert all(m["loss_stft"] > 0 and m["loss_periodic"] > 0 and m["loss_phase"] > 0 for m in metrics)
    assert torch.allclose(linear.weight, torch.tensor([mix])) and float(linear.bias) == 0  # frozen
    with pytest.raises(InputError, match="source_mix needs 9"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "source_mix": [1.0]}}, hift_corpus).build_generator()
    with pytest.raises(InputError, match="stft_resolutions"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "loss": {"stft_resolutions": [[256, 64, 512]]}}}, hift_corpus)


def test_more_source_harmonics_start_from_a_vocoder_with_fewer(hift_corpus, tmp_path):
    """A 45-harmonic source (``nb_harmonics: 44``) fine-tuned from a 9-harmonic export: the new ``source_mix``
    replaces the mix, every other weight carries over; without a mix the shapes cannot match and loading says so."""
    torch.manual_seed(0)
    small = HiFTStage(CONFIG, hift_corpus)
    small.setup(torch.device("cpu"), lambda m: m)
    small.export(tmp_path)
    mix = [4.0 / k for k in range(1, 46)]
    model = {**CONFIG["model"], "overrides": {"hift": {**CONFIG["model"]["overrides"]["hift"], "nb_harmonics": 44}}}
    hift = {**CONFIG["hift"], "init_hift": str(tmp_path), "source_mix": mix, "freeze_source_mix": True}
    large = HiFTStage({**CONFIG, "model": model, "hift": hift}, hift_corpus)
    large.setup(torch.device("cpu"), lambda m: m)
    assert torch.allclose(large.generator.m_source.l_linear.weight, torch.tensor([mix]))
    before = fold_weight_norm(dict(small.generator.state_dict()))
    after = fold_weight_norm(dict(large.generator.state_dict()))
    carried = [k for k in before if "l_linear" not in k]
    assert len(carried) > 50 and all(torch.allclose(before[k], after[k], atol=1e-6) for k in carried)
    metrics = large.train_step([large.dataset()[i] for i in range(2)], 0)  # crops draw 45 noise channels
    assert math.isfinite(metrics["loss"])
    with pytest.raises(CheckpointError, match="l_linear"):
        HiFTStage({**CONFIG, "model": model, "hift": {**CONFIG["hift"], "init_hift": str(tmp_path)}},
                  hift_corpus).build_generator()

    # Resuming a run whose (frozen) 9-harmonic mix the config widens: discriminators and optimisers carry over too.
    frozen9 = {**CONFIG["hift"], "source_mix": mix[:9], "freeze_source_mix": True, "average_decay": 0.9}
    run9 = HiFTStage({**CONFIG, "hift": frozen9}, hift_corpus)
    run9.setup(torch.device("cpu"), lambda m: m)
    run9.train_step([run9.dataset()[i] for i in range(2)], 0)
    run45 = HiFTStage({**CONFIG, "model": model, "hift": {**frozen9, "source_mix": mix}}, hift_corpus)
    run45.setup(torch.device("cpu"), lambda m: m)
    run45.load_state_dict(run9.state_dict())
    assert torch.allclose(run45.generator.m_source.l_linear.weight, torch.tensor([mix]))
    resumed, trained = run45.generator.state_dict(), run9.generator.state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in trained.items() if "l_linear" not in k)
    assert all(torch.equal(v, run9.discriminator.state_dict()[k]) for k, v in run45.discriminator.state_dict().items())
    assert math.isfinite(run45.train_step([run45.dataset()[i] for i in range(2)], 1)["loss"])
    with pytest.raises(InputError, match="periodic_span"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "loss": {"periodic_span": 0}}}, hift_corpus)
    with pytest.raises(InputError, match="phase_resolutions"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "loss": {"phase_resolutions": [[512, 1024]]}}}, hift_corpus)


def test_source_f0_target_drives_the_source_with_the_data_f0(hift_corpus):
    """``source_f0: target`` (teacher forcing): the sine source follows the crop's stored f0, not the predictor's
    guess, in both turns of a step; the default follows the prediction, as the reference."""
    def sources_of(source_f0: str) -> tuple[list[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        stage = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "source_f0": source_f0, "adversarial_start": 1}},
                          hift_corpus)
        stage.setup(torch.device("cpu"), lambda m: m)
        seen, build = [], stage.generator.source_from_f0
        stage.generator.source_from_f0 = lambda f0, **kw: (seen.append(f0.detach().clone()), build(f0, **kw))[1]
        batch = [stage.dataset()[i] for i in range(3)]
        for step in range(2):  # a warm-up step and a GAN step (one generator forward each)
            stage.train_step(batch, step)
        crops = crop_batch(batch, stage.cfg.segment_samples, stage.model_cfg.hop_length,
                           stage.model_cfg.nb_harmonics + 1, stage.train_cfg.seed, 1)
        return seen, crops.f0

    seen, target = sources_of("target")
    assert len(seen) == 2 and (target > 0).any()
    assert torch.equal(seen[-1], target)
    seen, target = sources_of("predicted")
    assert len(seen) == 2 and not torch.allclose(seen[-1], target, atol=1.0)
    with pytest.raises(InputError, match="source_f0"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "source_f0": "teacher"}}, hift_corpus)


def test_fill_f0_gaps_bridges_short_dropouts_only():
    from cadenza.audio.pitch import fill_f0_gaps

    f0 = torch.tensor([0, 100, 0, 121, 0, 0, 0, 90, 0, 0, 80, 0], dtype=torch.float32)
    out = fill_f0_gaps(f0, 2)
    assert out[2] == pytest.approx(110.0, rel=1e-5)  # log-linear: sqrt(100 * 121)
    assert torch.equal(out[4:7], f0[4:7])  # a 3-frame run stays unvoiced
    assert out[8] == pytest.approx(90 * (80 / 90) ** (1 / 3), rel=1e-5) and out[9] == pytest.approx(90 * (80 / 90) ** (2 / 3), rel=1e-5)
    assert out[0] == 0 and out[-1] == 0  # runs at the ends have a voiced frame on one side only
    assert torch.equal(fill_f0_gaps(f0, 0), f0)


def test_f0_targets_recomputed_with_a_voicing_threshold_and_filled(tmp_path):
    """``f0_track: yin`` recomputes the targets from the audio with ``f0_voicing_threshold``, ``f0_fill_gaps``
    bridges short dropouts after that; bad values are refused. The audio: a breathy tone (harmonics in noise), whose
    voicing depends on the threshold."""
    from cadenza.audio.pitch import fill_f0_gaps

    (tmp_path / "wavs").mkdir()
    t = torch.arange(2 * SR) / SR
    noise = torch.randn(2 * SR, generator=torch.Generator().manual_seed(0))
    wav = 0.2 * harmonic(torch.full((2 * SR,), 130.0)) + 0.12 * noise
    sf.write(tmp_path / "wavs" / "0.wav", (wav / wav.abs().max() * 0.9 * (t < 1.8)).numpy(), SR)
    (tmp_path / "manifest.jsonl").write_text(json.dumps({"audio": "wavs/0.wav"}) + "\n")

    def item(**hift) -> dict:
        return HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], **hift}}, tmp_path).dataset()[0]

    stored = item()
    wav, frames = stored["wav"], stored["f0"].shape[0]
    tracks = []
    for threshold, gaps in ((0.3, 0), (0.45, 0), (0.3, 3)):  # 45, 90 and 72 of 90 frames voiced
        expected = fill_f0_gaps(yin_f0(wav, SR, 480, frames, fmin=70.0, fmax=800.0, threshold=threshold), gaps)
        got = item(f0_track="yin", f0_voicing_threshold=threshold, f0_fill_gaps=gaps)["f0"]
        assert torch.equal(got, expected)
        tracks.append(got)
    voiced = [int((track > 0).sum()) for track in tracks]
    assert voiced[1] > voiced[0] and voiced[2] > voiced[0], voiced  # the settings matter on this audio
    assert torch.equal(item(f0_fill_gaps=0)["f0"], stored["f0"])
    for key, value in (("f0_track", "crepe"), ("f0_voicing_threshold", 1.5), ("f0_fill_gaps", -1)):
        with pytest.raises(InputError, match=key):
            HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], key: value}}, tmp_path)


class _ToyFlowMel:
    """A stand-in acoustic model for ``hift.input_mel: flow``: a mel made from the stored f0 (``needs``), unlike the
    audio's own mel, so a test can tell which one the generator was given."""

    name, fields, needs = "flow_mel", ("flow_mel",), ("f0",)

    def __call__(self, utt):
        assert set(utt.stored) == {"f0"}
        f0 = utt.stored["f0"]
        return {"flow_mel": (torch.log1p(f0)[:, None] - 6.0 + torch.linspace(0, 1, 80)).float()}


def test_input_mel_flow_trains_on_the_stored_mels_cropped_with_the_audio(hift_corpus, tmp_path):
    """``cadenza data extract`` hands an extractor the fields it ``needs``; ``hift.input_mel: flow`` then feeds the
    generator the stored ``flow_mel`` crop that lines up with the audio crop (not the crop's own mel)."""
    from cadenza.data.prepare import add_features, prepare

    with one_torch_thread():
        prepare(hift_corpus / "manifest.jsonl", "jsonl", tmp_path, progress=False)
        summary = add_features(tmp_path, _ToyFlowMel(), progress=False)
    assert summary["failed"] == 0
    cfg = {**CONFIG, "hift": {**CONFIG["hift"], "input_mel": "flow"}}
    stage = HiFTStage(cfg, tmp_path)
    stage.setup(torch.device("cpu"), lambda m: m)
    dataset = stage.dataset()
    item = dataset[0]
    frames = item["wav"].shape[0] // 480
    stored = dataset.source.stored(0, "flow_mel")
    assert item["mel"].shape == (80, frames) and torch.equal(item["mel"], stored[:frames].T)

    seen = []
    forward = stage.g_forward

    def spy(mel, *args):
        seen.append(mel.clone())
        return forward(mel, *args)

    stage.g_forward = spy
    batch = stage.collate([dataset[i] for i in range(3)])
    metrics = stage.train_step(batch, 4)
    assert math.isfinite(metrics["loss"])
    segment = CONFIG["hift"]["segment_samples"]
    crops = crop_batch(batch, segment, 480, 9, stage.train_cfg.seed, 4)
    assert crops.mel is not None and torch.equal(seen[-1], crops.mel)
    own = flow_prompt_mel(crops.speech, stage.mel_cfg)
    assert (seen[-1] - own).abs().mean() > 1.0  # not the audio's own mel
    for b, it in enumerate(batch):  # each mel crop is the stored frames where its audio crop starts
        starts = [k for k in range(it["wav"].shape[0] // 480)
                  if torch.equal(it["wav"][k * 480: k * 480 + segment], crops.speech[b])]
        assert starts, "the audio crop is not in its utterance"
        assert torch.equal(crops.mel[b], it["mel"][:, starts[0]: starts[0] + segment // 480])


def test_input_mel_flow_errors(hift_corpus, tmp_path):
    with pytest.raises(InputError, match="input_mel"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "input_mel": "teacher"}}, hift_corpus)
    stage = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "input_mel": "flow"}}, hift_corpus)  # a manifest folder
    stage.setup(torch.device("cpu"), lambda m: m)
    with pytest.raises(InputError, match="prepared corpus"):
        stage.dataset()
    from cadenza.data.prepare import prepare

    with pytest.raises(InputError, match="cadenza data extract"):  # an extractor with needs cannot run in prepare
        prepare(hift_corpus / "manifest.jsonl", "jsonl", tmp_path, progress=False, extractors=[_ToyFlowMel()])


def test_average_decay_exports_the_averaged_generator_and_resumes_it(hift_corpus, tmp_path):
    """``hift.average_decay``: the export holds the average of the generator's weights (not the last step's), the
    checkpoint state carries the average, and a checkpoint without one starts it from its weights."""
    torch.manual_seed(0)
    config = {**CONFIG, "hift": {**CONFIG["hift"], "average_decay": 0.5}}
    stage = HiFTStage(config, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    batch = [stage.dataset()[i] for i in range(3)]
    for step in range(4):
        stage.train_step(batch, step)
    assert stage.average.updates == 4
    stage.export(tmp_path)
    exported = torch.load(tmp_path / EXPORT_NAME, map_location="cpu", weights_only=True)
    averaged = release_state_dict(stage.average.averaged_module(stage.generator))
    last = release_state_dict(stage.generator)
    assert all(torch.equal(exported[k], averaged[k]) for k in exported)
    assert any(not torch.equal(exported[k], last[k]) for k in exported)

    resumed = HiFTStage(config, hift_corpus)
    resumed.setup(torch.device("cpu"), lambda m: m)
    resumed.load_state_dict(stage.state_dict())
    assert resumed.average.updates == 4
    assert all(torch.equal(resumed.average.average[k], v) for k, v in stage.average.average.items())

    plain = HiFTStage(CONFIG, hift_corpus)  # a run without the average, continued with one
    plain.setup(torch.device("cpu"), lambda m: m)
    plain.train_step(batch, 0)
    assert "generator_average" not in plain.state_dict()
    continued = HiFTStage(config, hift_corpus)
    continued.setup(torch.device("cpu"), lambda m: m)
    continued.load_state_dict(plain.state_dict())
    assert continued.average.updates == 0
    assert all(torch.equal(continued.average.average[k], p) for k, p in plain.generator.named_parameters())
    with pytest.raises(InputError, match="average_decay"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "average_decay": 1.0}}, hift_corpus)
