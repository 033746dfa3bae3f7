"""Training stage "hift": the HiFT vocoder as a GAN, exported as a release-layout ``hift.pt``.

See docs/training_components.md, "3. HiFT vocoder GAN".

Generator sizes and the input mel come from the ``model:`` section (the CosyVoice 2 config the vocoder belongs to,
see ``model_files``); the optimiser from ``train.optim`` (the recipe: Adam, lr 2e-4, clip 5; the same settings drive
the generator's and the discriminator's optimisers). Stage settings (``hift:`` section, ``HiFTStageConfig``)::

    hift:
      segment_samples: 24480      # crop length (51 mel frames)
      weight_norm: true           # weight-normalised convs while training, as the reference (false: plain convs)
      init_hift: null             # hift.pt or a model directory to start from (fine-tuning)
      f0_range: [70, 800]         # YIN search range when the data has no stored f0
      source_mix: null            # [nb_harmonics + 1] weights: reset the source's harmonic mix (l_linear), bias 0
      freeze_source_mix: false    # keep that mix fixed while training
      source_f0: predicted        # predicted | target: the f0 that drives the sine source while training
      f0_track: stored            # stored | yin: the f0 targets (yin: recomputed here with f0_voicing_threshold)
      f0_voicing_threshold: 0.15  # YIN's threshold when it runs here (higher: more frames voiced)
      f0_fill_gaps: 0             # fill unvoiced gaps of at most this many frames inside voiced stretches
      input_mel: audio            # audio | flow: the generator's input, the crop's own mel or the stored flow_mel
                                  # (the acoustic model's mels of the same audio, cadenza.training.hift.flow_mels)
      average_decay: 0            # > 0: export an exponential moving average of the generator's weights (e.g.
                                  # 0.999, ~1,000 steps; training/parameter_average.py); 0: the last step's weights
      speed_perturb: null         # [low, high]: crops played at a rate drawn in that range (pitch, formants and
      speed_perturb_share: 0.5    # tempo move together; the f0 track follows), this share of them
      source_path_gain: 1.0       # scale the decoder's source input convs (source_downs) by this before training
      phone_model: null           # a folder with a frame-classifier speech_tokenizer.json/.safetensors: the
                                  # phone loss's recogniser (loss.phone_feature_weight / phone_posterior_weight)
      discriminator: {}           # DiscriminatorConfig fields
      loss: {}                    # HiFTLossConfig fields (weights, TPR tau, the loss mel)
      discriminator_bf16: false   # the discriminators under bfloat16 autocast (faster where bf16 is native)
      even_upsample_gain: []      # upsampler indices (ups.N) held to the same gain in every output phase (no
                                  # buzz at the input frame rate; training/hift/upsampler_phases.py)
      data_format: auto           # auto | shards | manifest (see wav_manifest)
      manifest: manifest.jsonl
      shard_sample_rate: 24000

One ``train_step`` = the reference's two turns on one batch: a discriminator step (generator output detached), then
a generator step; one generator forward serves both, and the generator's turn keeps the discriminator's weights out
of its backward (the reference's gradients for less work, ``benchmarks/hift_train_step.py``). The export writes
``hift.pt`` (parametrization weight-norm names, loadable by ``HiFTGenerator.load_reference_state_dict`` and the
model loader) and the model's ``cosyvoice2.yaml``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadenza.audio.mel import flow_prompt_mel
from cadenza.engine.precision import detect_cpu
from cadenza.errors import InputError
from cadenza.loading import read_torch_state_dict
from cadenza.models.cosyvoice2.hift import HiFTGenerator
from cadenza.models.cosyvoice2.nsf_source import SourceNoise
from cadenza.training.checkpoint import atomic_torch_save
from cadenza.training.config import TrainConfig, dataclass_from_dict
from cadenza.training.hift.config import DiscriminatorConfig, HiFTLossConfig, config_from_mapping
from cadenza.training.hift.data import HiFTUtterances, crop_batch
from cadenza.training.hift.discriminators import FeatureMaps, HiFTDiscriminator, Scores
from cadenza.training.hift.losses import (
    discriminator_adv_loss,
    f0_l1_loss,
    feature_matching_loss,
    generator_adv_loss,
    hop_periodic_loss,
    instantaneous_frequency_loss,
    loss_mel_config,
    mel_l1_loss,
    multi_resolution_stft_loss,
    tpr_loss,
)
from cadenza.training.hift.phone_loss import PhoneLoss
from cadenza.training.hift.upsampler_phases import even_upsample_gain, phase_gain_imbalance
from cadenza.training.hift.weight_norm_io import apply_weight_norm, release_state_dict
from cadenza.training.init_weights import component_file
from cadenza.training.model_files import check_writable, resolve_model, write_model_config
from cadenza.training.optim import Optimization
from cadenza.training.parameter_average import ParameterAverage
from cadenza.training.stage import TrainingStage, Wrap, register
from cadenza.training.wav_manifest import MANIFEST_NAME, open_utterances

log = logging.getLogger(__name__)

EXPORT_NAME = "hift.pt"
INPUT_MELS = {"audio": None, "flow": "flow_mel"}  # hift.input_mel -> the stored field it reads


@dataclass(frozen=True)
class HiFTStageConfig:
    segment_samples: int = 24480
    weight_norm: bool = True
    adversarial_start: int = 0  # steps of mel/f0-only generator training before the GAN losses switch on
    # Steps, from ``adversarial_start`` on, in which only the discriminators train (the generator is held). A released
    # ``hift.pt`` comes without its discriminators, so fine-tuning one pits fresh, random discriminators against a
    # trained generator: their first gradients are noise that the generator follows away from where it was (the
    # long round from cadenza-tiny's shipped vocoder read worse at step 500 than at its start). A warm-up lets them
    # learn what the generator gets wrong first; a discriminator step is about half a GAN step.
    discriminator_warmup: int = 0
    init_hift: str | None = None
    f0_range: tuple[float, float] = (70.0, 800.0)
    discriminator: dict = field(default_factory=dict)
    loss: dict = field(default_factory=dict)
    data_format: str = "auto"
    manifest: str = MANIFEST_NAME
    shard_sample_rate: int = 24000
    # The harmonic source's mixing layer (``m_source.l_linear``): a vocoder can learn to silence its source (the
    # v1 cadenza-tiny HiFT has weights ~0.003 there, a near-constant excitation, and sounds breathy on a low voice);
    # ``source_mix`` resets those weights (bias 0) before training, ``freeze_source_mix`` keeps them fixed.
    source_mix: tuple[float, ...] | None = None
    freeze_source_mix: bool = False
    # What drives the sine source while training. ``predicted`` (the reference): the f0 predictor's output, so the
    # decoder trains on the source it gets at inference; while the predictor is still ~10-20 % off, that source's
    # harmonics miss the target's and the decoder learns to ignore them. ``target``: the data's f0 (teacher forcing,
    # as NSF vocoders train), so the source lines up with the target's harmonics and the decoder learns to use it;
    # the predictor still learns from the f0 loss and drives the source at inference.
    source_f0: str = "predicted"
    # The f0 targets (the predictor's and, with ``source_f0: target``, the source's). YIN at its default threshold
    # (0.15) calls ~31 % of the frames of cadenza-tiny's breathy low teacher voice voiced, with single-frame dropouts
    # inside voiced stretches; a source that switches off there teaches the decoder to voice without it.
    f0_track: str = "stored"
    f0_voicing_threshold: float = 0.15
    f0_fill_gaps: int = 0
    # The generator's input mel. ``audio`` (the reference): computed from the crop. ``flow``: the stored
    # ``flow_mel`` of the utterance (what the acoustic model makes of its tokens, ``training/hift/flow_mels.py``),
    # cropped in step with the audio, so the vocoder learns to render the mels it is given at inference.
    input_mel: str = "audio"
    # An exponential moving average of the generator's weights, exported instead of the last step's (0: off). A
    # small-batch GAN's generator moves a lot from step to step; the average makes the export less a matter of luck.
    average_decay: float = 0.0
    # Speed perturbation (resampling a share of the crops by a rate drawn log-uniformly in [low, high]). A vocoder
    # trained on one low voice (cadenza-tiny's joe, f0 ~85 Hz) can fake the voicing with a pattern locked to its
    # 50 Hz input frames (100 Hz at half a frame) instead of following the source's f0; crops at other pitches make
    # that pattern wrong, so the decoder has to take its periodicity from the source (docs/cadenza-tiny.md).
    speed_perturb: tuple[float, float] | None = None
    speed_perturb_share: float = 0.5
    # The decoder's way in for the source (``source_downs``, the convs that bring the source's STFT to each upsampling
    # stage), scaled by this factor before training (1 = unchanged). A vocoder that learnt to voice from the mel alone
    # has turned its source down: cadenza-tiny's HiFT follows the source's pitch on 35 % of voiced frames; with these
    # convs doubled, 53 % (at the cost of its spectrum, which training then has to win back).
    source_path_gain: float = 1.0
    # The phone loss's recogniser (training/hift/phone_loss.py): a folder holding a frame-classifier speech tokenizer
    # (cadenza-tiny's own model folder has one). Needed when a phone weight of ``loss`` is above 0.
    phone_model: str | None = None
    # The discriminators' convolutions under bfloat16 autocast (their scores and feature maps come back float32, and
    # every loss is computed in float32). They are most of a GAN step on a CPU and ran 1.7-1.8x as fast so on one
    # with AVX-512 BF16; off by default (the reference trains in float32).
    discriminator_bf16: bool = False
    # Upsamplers (indices into ``ups``) whose output phases are held to one gain while training, by a projection
    # on every forward (training/hift/upsampler_phases.py): a transposed convolution whose phases differ buzzes at
    # its input frame rate, and cadenza-tiny's vocoder had learnt to voice with that buzz at 50 Hz (ups.0).
    even_upsample_gain: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.average_decay < 1:
            raise InputError(f"hift.average_decay must be in [0, 1), got {self.average_decay}")
        if self.input_mel not in INPUT_MELS:
            raise InputError(f"hift.input_mel must be one of {', '.join(INPUT_MELS)}, got {self.input_mel!r}")
        if self.f0_track not in ("stored", "yin"):
            raise InputError(f"hift.f0_track must be 'stored' or 'yin', got {self.f0_track!r}")
        if not 0 < self.f0_voicing_threshold < 1:
            raise InputError(f"hift.f0_voicing_threshold must be in (0, 1), got {self.f0_voicing_threshold}")
        if self.f0_fill_gaps < 0:
            raise InputError(f"hift.f0_fill_gaps must be >= 0, got {self.f0_fill_gaps}")
        if self.source_f0 not in ("predicted", "target"):
            raise InputError(f"hift.source_f0 must be 'predicted' or 'target', got {self.source_f0!r}")
        if len(self.f0_range) != 2 or not 0 < self.f0_range[0] < self.f0_range[1]:
            raise InputError(f"hift.f0_range must be [low, high] Hz with 0 < low < high, got {self.f0_range!r}")
        if self.speed_perturb is not None:
            if len(self.speed_perturb) != 2 or not 0 < self.speed_perturb[0] <= self.speed_perturb[1]:
                raise InputError(f"hift.speed_perturb must be [low, high] with 0 < low <= high, "
                                 f"got {self.speed_perturb!r}")
            if self.input_mel != "audio":
                raise InputError("hift.speed_perturb needs hift.input_mel: audio (a stored mel would not follow "
                                 "the perturbed audio)")
        if not self.source_path_gain > 0:
            raise InputError(f"hift.source_path_gain must be > 0, got {self.source_path_gain}")
        if not 0 <= self.speed_perturb_share <= 1:
            raise InputError(f"hift.speed_perturb_share must be in [0, 1], got {self.speed_perturb_share}")
        if self.adversarial_start < 0:
            raise InputError(f"hift.adversarial_start must be >= 0, got {self.adversarial_start}")
        if self.discriminator_warmup < 0:
            raise InputError(f"hift.discriminator_warmup must be >= 0, got {self.discriminator_warmup}")


class GeneratorForward(nn.Module):
    """The generator's training forward as one module call (one DDP forward): ``mel [B, n_mels, F]`` and the source
    noise -> ``(speech [B, hop * F], f0 [B, F])``. The f0 predictor learns only from the f0 loss: the sine source
    is built without gradient, as in the reference. ``source_f0 [B, F]``, if given, drives the source instead of
    the prediction (teacher forcing, ``hift.source_f0: target``)."""

    def __init__(self, generator: HiFTGenerator) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, mel: torch.Tensor, rand_ini: torch.Tensor, sine_noise: torch.Tensor,
                source_f0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        f0 = self.generator.f0_predictor(mel)
        source = self.generator.source_from_f0(f0 if source_f0 is None else source_f0,
                                               noise=SourceNoise(rand_ini, sine_noise))
        return self.generator.decode(mel, source), f0


def _float32(outputs):
    """Discriminator outputs (nested lists / tuples of tensors) as float32, for the losses."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float()
    return type(outputs)(_float32(x) for x in outputs)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """``module``'s parameters take no gradient inside the block (those that did take one again after it)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def with_source_mix_of(state: dict[str, Any], generator: HiFTGenerator) -> dict[str, Any]:
    """``state`` (a generator's tensors) with ``generator``'s harmonic mix (``m_source.l_linear``) in place of its own,
    which may have another number of harmonics (``nb_harmonics``); every other weight is kept."""
    mix = {f"m_source.l_linear.{k}": v.detach().clone() for k, v in generator.m_source.l_linear.state_dict().items()}
    return {k: v for k, v in state.items() if "m_source.l_linear." not in k} | mix


@register
class HiFTStage(TrainingStage):
    name = "hift"
    # No mixed-precision autocast: the iSTFT / complex path and the GAN losses are not bf16-safe (and on a CPU with
    # native bf16 the generator's convolutions gained only 0.9-1.8x at this size, docs/training.md). Only the
    # discriminators may run in bf16, by their own switch (``hift.discriminator_bf16``).
    autocast = False

    def __init__(self, config: dict[str, Any], data_dir: Path) -> None:
        super().__init__(config, data_dir)
        self.train_cfg = TrainConfig.from_dict(config.get("train"))
        self.cfg = dataclass_from_dict(HiFTStageConfig, config.get("hift"), "hift")
        self.disc_cfg = config_from_mapping(DiscriminatorConfig, self.cfg.discriminator, "hift.discriminator")
        self.loss_cfg = config_from_mapping(HiFTLossConfig, self.cfg.loss, "hift.loss")
        self.source = resolve_model(config.get("model"))
        check_writable(self.source.config)
        self.model_cfg = self.source.config.hift
        self.mel_cfg = self.source.config.mel
        if self.cfg.segment_samples <= 0 or self.cfg.segment_samples % self.model_cfg.hop_length:
            raise InputError(f"hift.segment_samples {self.cfg.segment_samples} must be a positive multiple of the "
                             f"vocoder's {self.model_cfg.hop_length} samples per mel frame")
        if self.loss_cfg.uses_phone_loss and not self.cfg.phone_model:
            raise InputError("hift.loss.phone_feature_weight / phone_posterior_weight need hift.phone_model (a "
                             "folder with a frame-classifier speech_tokenizer.json and .safetensors)")
        upsamplers = len(self.model_cfg.upsample_rates)
        for what, indices in (("hift.even_upsample_gain", self.cfg.even_upsample_gain),
                              ("hift.loss.upsample_gain_layers", self.loss_cfg.upsample_gain_layers)):
            if any(not isinstance(i, int) or not 0 <= i < upsamplers for i in indices):
                raise InputError(f"{what} must name upsamplers 0 to {upsamplers - 1} (ups.N), got {list(indices)}")
        self._dataset: HiFTUtterances | None = None

    def build_generator(self) -> HiFTGenerator:
        """The generator as trained: from ``init_hift`` if given, weight-normalised if configured."""
        generator = HiFTGenerator(self.model_cfg)
        if self.cfg.init_hift:
            state = read_torch_state_dict(component_file(self.cfg.init_hift, EXPORT_NAME, "hift.init_hift"))
            if self.cfg.source_mix is not None:  # reset below anyway
                state = with_source_mix_of(state, generator)
            generator.load_reference_state_dict(state)
        mix = generator.m_source.l_linear
        if self.cfg.source_mix is not None:
            if len(self.cfg.source_mix) != mix.in_features:
                raise InputError(f"hift.source_mix needs {mix.in_features} weights (nb_harmonics + 1), "
                                 f"got {len(self.cfg.source_mix)}")
            with torch.no_grad():
                mix.weight.copy_(torch.tensor(self.cfg.source_mix, dtype=mix.weight.dtype).reshape(1, -1))
                mix.bias.zero_()
        if self.cfg.freeze_source_mix:
            mix.requires_grad_(False)
        if self.cfg.source_path_gain != 1.0:
            with torch.no_grad():
                for conv in generator.source_downs:
                    conv.weight.mul_(self.cfg.source_path_gain)
                    conv.bias.mul_(self.cfg.source_path_gain)
        if self.cfg.weight_norm:
            apply_weight_norm(generator)
        for index in self.cfg.even_upsample_gain:
            even_upsample_gain(generator.ups[index])
        return generator

    def setup(self, device: torch.device, wrap: Wrap) -> None:
        self.device = torch.device(device)
        if self.cfg.discriminator_bf16 and self.device.type == "cpu" and not (cpu := detect_cpu()).fast_bf16:
            log.warning("hift.discriminator_bf16 is on, but this CPU (%s) has no bfloat16 arithmetic: it is emulated, "
                        "several times slower than float32 here; set it to false on this machine", cpu.describe())
        self.generator = self.build_generator().to(self.device).train()
        self.discriminator = HiFTDiscriminator(self.disc_cfg).to(self.device).train()
        self.g_forward = wrap(GeneratorForward(self.generator))
        self.d_forward = wrap(self.discriminator)
        optim, steps = self.train_cfg.optim, self.train_cfg.max_steps
        self.opt_g = Optimization([p for p in self.generator.parameters() if p.requires_grad], optim, steps)
        self.opt_d = Optimization(self.discriminator.parameters(), optim, steps)
        self.average = (ParameterAverage(self.generator, self.cfg.average_decay)
                        if self.cfg.average_decay > 0 else None)
        self.loss_mel = loss_mel_config(self.loss_cfg, self.model_cfg.sampling_rate)
        self.phone_loss = (PhoneLoss.from_path(self.cfg.phone_model, self.model_cfg.sampling_rate).to(self.device)
                           if self.loss_cfg.uses_phone_loss else None)

    def dataset(self) -> HiFTUtterances:
        if self._dataset is None:
            stored_mel = INPUT_MELS[self.cfg.input_mel]
            source = open_utterances(self.data_dir, self.cfg.data_format, self.cfg.manifest,
                                     self.cfg.shard_sample_rate, (stored_mel,) if stored_mel else ())
            self._dataset = HiFTUtterances(source, range(len(source)), self.model_cfg.sampling_rate,
                                           self.model_cfg.hop_length, self.cfg.f0_range, self.cfg.f0_track,
                                           self.cfg.f0_voicing_threshold, self.cfg.f0_fill_gaps, stored_mel)
        return self._dataset

    def collate(self, items: Sequence[dict]) -> list[dict]:
        return list(items)  # crops are drawn in train_step, where the step (and so the random stream) is known

    def train_step(self, batch: list[dict], step: int) -> dict[str, float]:
        crops = crop_batch(batch, self.cfg.segment_samples, self.model_cfg.hop_length,
                           self.model_cfg.nb_harmonics + 1, self.train_cfg.seed, step,
                           self.cfg.speed_perturb, self.cfg.speed_perturb_share)
        speech = crops.speech.to(self.device)
        f0_target = crops.f0.to(self.device)
        rand_ini, sine_noise = crops.rand_ini.to(self.device), crops.sine_noise.to(self.device)
        source_f0 = f0_target if self.cfg.source_f0 == "target" else None
        if crops.mel is not None:  # hift.input_mel: flow — the acoustic model's mel of this audio
            mel = crops.mel.to(self.device)
        else:
            with torch.no_grad():
                mel = flow_prompt_mel(speech, self.mel_cfg)  # the generator's input, from the crop (as the reference)
        lc = self.loss_cfg

        if step < self.cfg.adversarial_start:
            # Warm-up without discriminators (a third of the compute): the generator first learns the mel and f0
            # regression, so the GAN starts from speech-like output instead of noise (useful on small budgets).
            fake, f0_pred = self.g_forward(mel, rand_ini, sine_noise, source_f0)
            loss, terms = self._regression_losses(speech, fake, f0_pred, f0_target)
            lr = self.opt_g.lr
            grad_g = self.opt_g.step(loss)
            self._update_average()
            zero = torch.zeros((), device=self.device)
            metrics = {"loss": loss, "loss_d": zero, "loss_d_adv": zero, "loss_d_tpr": zero, "loss_adv": zero,
                       "loss_fm": zero, "loss_tpr": zero, **terms}
            return {**{k: float(v.detach()) for k, v in metrics.items()}, "grad_norm_g": grad_g, "grad_norm_d": 0.0,
                    "lr": lr}

        # One generator forward serves both turns: the discriminator's turn reads it detached, and the generator
        # does not change in between (the reference ran it twice, the first time without a graph). While the
        # discriminators warm up, the generator is held and needs no graph.
        holding_generator = step < self.cfg.adversarial_start + self.cfg.discriminator_warmup
        with torch.no_grad() if holding_generator else contextlib.nullcontext():
            fake, f0_pred = self.g_forward(mel, rand_ini, sine_noise, source_f0)

        # Discriminator turn.
        with self._discriminator_precision():
            real_scores, fake_scores, _, _ = _float32(self.d_forward(speech, fake.detach()))
        loss_d_adv = discriminator_adv_loss(real_scores, fake_scores)
        loss_d_tpr = tpr_loss(real_scores, fake_scores, lc.tpr_tau)
        loss_d = loss_d_adv + lc.tpr_weight * loss_d_tpr
        lr = self.opt_g.lr
        grad_d = self.opt_d.step(loss_d)
        if holding_generator:  # the generator's losses are logged (it stands still) but not stepped
            with torch.no_grad():
                loss, terms = self._regression_losses(speech, fake, f0_pred, f0_target)
            zero = torch.zeros((), device=self.device)
            metrics = {"loss": loss, "loss_d": loss_d, "loss_d_adv": loss_d_adv, "loss_d_tpr": loss_d_tpr,
                       "loss_adv": zero, "loss_fm": zero, "loss_tpr": zero, **terms}
            return {**{k: float(v.detach()) for k, v in metrics.items()}, "grad_norm_g": 0.0, "grad_norm_d": grad_d,
                    "lr": lr}

        # Generator turn, against the updated discriminator: only the generated audio needs a graph, and only back
        # to the generator, so real audio is scored without one and the discriminator's weights are held out of the
        # backward: the same generator gradient as scoring both together with a trainable discriminator
        # (tests/training/test_hift_gan_step.py), and with the single generator forward 0.69x the step time at
        # cadenza-tiny's size (benchmarks/hift_train_step.py). The plain module, not the DDP wrapper: no weight of
        # it takes a gradient here, so there is nothing to all-reduce.
        with torch.no_grad(), self._discriminator_precision():
            real_scores, real_maps = _float32(self.discriminator.score(speech))
        with frozen(self.discriminator):
            with self._discriminator_precision():
                fake_scores, fake_maps = _float32(self.discriminator.score(fake))
            loss_g, metrics = self._generator_loss(speech, fake, f0_pred, f0_target, real_scores, fake_scores,
                                                   real_maps, fake_maps)
            grad_g = self.opt_g.step(loss_g)
        self._update_average()
        metrics.update(loss_d=loss_d, loss_d_adv=loss_d_adv, loss_d_tpr=loss_d_tpr)
        return {**{k: float(v.detach()) for k, v in metrics.items()}, "grad_norm_g": grad_g, "grad_norm_d": grad_d,
                "lr": lr}

    def _generator_loss(self, speech: torch.Tensor, fake: torch.Tensor, f0_pred: torch.Tensor,
                        f0_target: torch.Tensor, real_scores: Scores, fake_scores: Scores, real_maps: FeatureMaps,
                        fake_maps: FeatureMaps) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The generator's GAN-turn loss and its terms, from the discriminator's scores and feature maps of the real
        ``speech [B, L]`` and the generated ``fake [B, L]``."""
        lc = self.loss_cfg
        loss_adv = generator_adv_loss(fake_scores)
        loss_fm = feature_matching_loss(real_maps, fake_maps)
        loss_tpr = tpr_loss(fake_scores, real_scores, lc.tpr_tau)
        loss_regression, terms = self._regression_losses(speech, fake, f0_pred, f0_target)
        loss_g = lc.adv_weight * loss_adv + lc.fm_weight * loss_fm + lc.tpr_weight * loss_tpr + loss_regression
        return loss_g, {"loss": loss_g, "loss_adv": loss_adv, "loss_fm": loss_fm, "loss_tpr": loss_tpr, **terms}

    def _regression_losses(self, speech: torch.Tensor, fake: torch.Tensor, f0_pred: torch.Tensor,
                           f0_target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The generator's losses that need no discriminator (the warm-up's whole loss, and part of the GAN turn's):
        their weighted sum and each term, for the real ``speech [B, L]``, the generated ``fake [B, L]`` and the f0
        ``[B, F]`` predicted and targeted."""
        lc = self.loss_cfg
        terms = {"loss_mel": mel_l1_loss(speech, fake, self.loss_mel), "loss_f0": f0_l1_loss(f0_pred, f0_target),
                 "loss_stft": self._stft_loss(speech, fake), "loss_periodic": self._periodic_loss(speech, fake),
                 "loss_phase": self._phase_loss(speech, fake)}
        terms["loss_phone_feature"], terms["loss_phone_posterior"] = self._phone_losses(speech, fake)
        terms["loss_upsample_gain"] = self._upsample_gain_loss()
        weights = {"loss_mel": lc.mel_weight, "loss_f0": lc.f0_weight, "loss_stft": lc.stft_weight,
                   "loss_periodic": lc.periodic_weight, "loss_phone_feature": lc.phone_feature_weight,
                   "loss_phone_posterior": lc.phone_posterior_weight, "loss_upsample_gain": lc.upsample_gain_weight,
                   "loss_phase": lc.phase_weight}
        return sum(weights[k] * v for k, v in terms.items()), terms

    def _discriminator_precision(self) -> contextlib.AbstractContextManager:
        return (torch.autocast(self.device.type, dtype=torch.bfloat16) if self.cfg.discriminator_bf16
                else contextlib.nullcontext())

    def _update_average(self) -> None:
        if self.average is not None:
            self.average.update(self.generator)

    def _periodic_loss(self, speech: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        if self.loss_cfg.periodic_weight == 0:
            return torch.zeros((), device=self.device)
        return hop_periodic_loss(speech, fake, self.model_cfg.hop_length, self.loss_cfg.periodic_span)

    def _phase_loss(self, speech: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        lc = self.loss_cfg
        if lc.phase_weight == 0:
            return torch.zeros((), device=self.device)
        sample_rate = self.model_cfg.sampling_rate
        return sum(instantaneous_frequency_loss(speech, fake, n_fft, hop, sample_rate, lc.phase_max_hz)
                   for n_fft, hop in lc.phase_resolutions) / len(lc.phase_resolutions)

    def _upsample_gain_loss(self) -> torch.Tensor:
        """The summed phase-gain imbalance of the penalised upsamplers (a function of the weights alone)."""
        if self.loss_cfg.upsample_gain_weight == 0:
            return torch.zeros((), device=self.device)
        return sum(phase_gain_imbalance(self.generator.ups[i]) for i in self.loss_cfg.upsample_gain_layers)

    def _phone_losses(self, speech: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.phone_loss is None:
            zero = torch.zeros((), device=self.device)
            return zero, zero
        return tuple(self.phone_loss(speech, fake))

    def _stft_loss(self, speech: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        if self.loss_cfg.stft_weight == 0:
            return torch.zeros((), device=self.device)
        return multi_resolution_stft_loss(speech, fake, self.loss_cfg.stft_resolutions)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": {k: v.detach().cpu() for k, v in self.generator.state_dict().items()},
                "discriminator": {k: v.detach().cpu() for k, v in self.discriminator.state_dict().items()},
                "optim_g": self.opt_g.state_dict(), "optim_d": self.opt_d.state_dict(),
                **({"generator_average": self.average.state_dict()} if self.average is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.cfg.source_mix is not None and self.cfg.freeze_source_mix:
            # A fixed mix set by the config is not the checkpoint's to restore (nor in its optimiser): a run can
            # resume from one whose source had another number of harmonics (``nb_harmonics``).
            state = {**state, "generator": with_source_mix_of(state["generator"], self.generator)}
            if (average := state.get("generator_average")) is not None:
                state["generator_average"] = {**average, "average": with_source_mix_of(average["average"],
                                                                                       self.generator)}
        self.generator.load_state_dict(state["generator"], strict=True)
        self.discriminator.load_state_dict(state["discriminator"], strict=True)
        self.opt_g.load_state_dict(state["optim_g"])
        self.opt_d.load_state_dict(state["optim_d"])
        if self.average is not None:
            self.average.resume(state.get("generator_average"), self.generator)

    def export(self, out_dir: Path) -> None:
        """``hift.pt`` in the release layout (the averaged weights with ``hift.average_decay``) + the model's
        ``cosyvoice2.yaml`` (as the other stages write it)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        generator = self.generator if self.average is None else self.average.averaged_module(self.generator)
        atomic_torch_save(release_state_dict(generator), out / EXPORT_NAME)
        write_model_config(out, self.source.config, self.source.tokenizer_dir)
