"""The differentiable ASR reward ``L_ASR`` of CosyVoice 2 (§2.7): how well the speech tokens the LM would emit can be
read back as the text, with a gradient into the LM.

See docs/training.md, "Reinforcement stage".

Path (every step differentiable, so the gradient of the transcript's negative log-likelihood reaches the LM logits)::

    LM logits over speech ids [B, T, V]
      -> Gumbel-softmax, straight-through (``gumbel_softmax_st``): forward = one-hot of a sampled token id,
         backward = the gradient of softmax((logits + g) / temperature)
      -> FSQ code inverse as a matrix product: probs [B, T, V] @ code table [V, D] (the quantised low-rank vector
         ``codes / K`` of each id) -> up-projection (the tokenizer's ``quantizer.out_proj``) [B, T, H]
      -> the tokenizer's Encoder2 (the encoder part after quantisation) -> CTC head -> log-probs [B, T, C]
      -> CTC negative log-likelihood of the transcript's characters.

The ASR backend is the training-only half of a supervised FSQ tokenizer trained by ``cadenza train tokenizer``:
``speech_tokenizer.safetensors`` holds the inference half only (encoder, quantiser), so the backend is read from
the tokenizer *run folder*: its ``speech_tokenizer.json`` (sizes, character vocabulary) and the newest
``checkpoints/step_N.pt`` (``tokenizer.quantizer.out_proj``, ``encoder2``, ``asr_head``). It is frozen
(``requires_grad_(False)``, eval mode, never given to an optimiser): its weights stay bit-for-bit what they were.

A tokenizer without FSQ codes (a frame classifier, cadenza-tiny v2) gets its backend from a *token reader*
(``token_reader.py``, ``cadenza train token_reader``): an embedding table ``[V, H]`` in place of the code table and
up-projection (the same matrix product of the token distribution), its own encoder and CTC head. Both backends have
one interface, ``forward(token_probs [B, T, V], mask [B, T]) -> log-probs [B, T * frames_per_token, C]``, so the
loss below is the same code for both.

The released S3 tokenizer (``speech_tokenizer_v2.onnx``) ships without its up-projection and ASR decoder, so L_ASR
cannot be computed for an LM that speaks S3 tokens; ``load_asr_backend`` refuses it saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import CheckpointError, InputError
from cadenza.layers.fsq_codes import index_to_codes
from cadenza.models.speech_tokenizer.char_vocab import BLANK, CharVocab
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.encoder import TransformerEncoder
from cadenza.models.speech_tokenizer.inference import CONFIG_NAME, read_speech_tokenizer_json
from cadenza.training.checkpoint import latest_checkpoint, load_checkpoint
from cadenza.training.token_reader import TokenReader, find_token_reader, load_token_reader

S3_ONNX = "speech_tokenizer_v2.onnx"
S3_REFUSAL = (
    "the released S3 tokenizer (speech_tokenizer_v2.onnx) is an ONNX graph of the encoder and quantiser only: its "
    "up-projection and ASR decoder were not released, so there is no ASR head to compute L_ASR with. Either train "
    "a supervised FSQ tokenizer (`cadenza train tokenizer`; its checkpoints keep the CTC head), re-tokenise the "
    "corpus with it and train the LM on those tokens, then give its run folder as asr_reward.tokenizer; or train "
    "an up-projection + encoder + CTC head on the S3 codes yourself (not provided). See docs/training.md, "
    "'Reinforcement stage'.")
READER_HINT = ("train a token reader: cadenza train token_reader --config configs/train/token_reader_tiny.yaml "
               "--data LM_CORPUS --out runs/reader (token_reader.model.codebook_size = the LM's speech vocabulary), "
               "then give that folder as asr_reward.reader")


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Gumbel(0, 1) draws of ``shape`` (CPU float32)."""
    u = torch.rand(shape, generator=generator)
    return -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))


def gumbel_softmax_st(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None,
                      straight_through: bool = True, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A Gumbel-softmax sample over the last dimension. ``logits [..., V]`` -> ``[..., V]`` (float32).

    ``straight_through``: the forward value is the exact one-hot of ``argmax(logits + g)`` (a sample of
    ``softmax(logits)``), the gradient that of the relaxed ``softmax((logits + g) / temperature)``. Otherwise the
    relaxed sample itself, which tends to the same one-hot as ``temperature -> 0``. ``noise`` (``[..., V]``
    Gumbel(0, 1) draws) replaces the draw from ``generator`` (tests compare paths on the same noise).
    """
    if not temperature > 0:
        raise InputError(f"gumbel temperature must be > 0, got {temperature}")
    logits = logits.float()
    if noise is None:
        noise = gumbel_noise(tuple(logits.shape), generator)
    perturbed = logits + noise.to(logits.device)
    soft = torch.softmax(perturbed / temperature, dim=-1)
    if not straight_through:
        return soft
    hard = F.one_hot(perturbed.argmax(-1), logits.shape[-1]).to(soft.dtype)
    return hard + (soft - soft.detach())


class TokenASRBackend(nn.Module):
    """Frozen ASR half of a supervised FSQ tokenizer, fed *distributions* over token ids.

    ``token_probs [B, T, V]`` (rows sum to 1; one-hot for hard tokens), ``mask [B, T]`` bool -> CTC log-probs
    ``[B, T, C]`` (blank = 0). A one-hot row gives exactly the tokenizer's own ``embed_ids`` of that id.
    """

    frames_per_token = 1  # the CTC runs at the token rate

    def __init__(self, cfg: SpeechTokenizerConfig) -> None:
        super().__init__()
        if cfg.frame_classes:
            raise InputError("a frame-classifier tokenizer has no FSQ codes to invert")
        if cfg.vocab_size < 2:
            raise InputError("this tokenizer has no ASR head (vocab_size 0)")
        self.cfg = cfg
        self.out_proj = nn.Linear(cfg.fsq_dims, cfg.hidden_size)
        self.encoder = TransformerEncoder(cfg, cfg.encoder2_layers)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        ids = torch.arange(cfg.codebook_size)
        # [V, D]: the quantised low-rank vector of every id, as the quantiser feeds out_proj (codes / K)
        self.register_buffer("code_table", index_to_codes(ids, cfg.fsq_scale, cfg.fsq_dims).float() / cfg.fsq_scale,
                             persistent=False)

    @property
    def codebook_size(self) -> int:
        return self.code_table.shape[0]

    def forward(self, token_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        codes = token_probs.to(self.code_table.dtype) @ self.code_table  # soft FSQ inverse: [B, T, D]
        x = self.encoder(self.out_proj(codes), mask)
        return torch.log_softmax(self.head(x).float(), dim=-1)

    def load_supervised_state(self, state: dict[str, torch.Tensor], where: str) -> None:
        """Take the weights from a ``SupervisedSpeechTokenizer.state_dict()`` (the tokenizer stage's checkpoint)."""
        mapping = {"tokenizer.quantizer.out_proj.": "out_proj.", "encoder2.": "encoder.", "asr_head.": "head."}
        own = {}
        for key, value in state.items():
            for src, dst in mapping.items():
                if key.startswith(src):
                    own[dst + key[len(src):]] = value
        if not any(k.startswith("head.") for k in own):
            raise CheckpointError(f"{where} holds no ASR head (asr_head.*): not a supervised FSQ tokenizer checkpoint")
        missing, unexpected = self.load_state_dict(own, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{where} does not fit the tokenizer config beside it: missing {missing[:4]}, "
                                  f"unexpected {unexpected[:4]}")


@dataclass
class ASRBackend:
    """A loaded, frozen backend with the character vocabulary its CTC head was trained on."""

    model: TokenASRBackend | TokenReader  # forward(token_probs [B, T, V], mask) -> [B, T * frames_per_token, C]
    vocab: CharVocab
    source: Path


def load_asr_backend(path: str | Path, device: torch.device | str = "cpu") -> ASRBackend:
    """The frozen ASR backend of a ``cadenza train tokenizer`` run folder (or one of its checkpoint files), or of a
    ``cadenza train token_reader`` output folder (``token_reader.json`` + ``.safetensors``, or either file).

    Raises ``InputError`` / ``CheckpointError`` saying what is missing: the released S3 tokenizer, an exported
    tokenizer folder without the run's checkpoints, a frame-classifier tokenizer (train a token reader), a tokenizer
    without ASR head.
    """
    path = Path(path).expanduser()
    if path.suffix == ".onnx" or (path.is_dir() and (path / S3_ONNX).is_file() and not (path / CONFIG_NAME).is_file()):
        raise InputError(f"{path}: {S3_REFUSAL}")
    if (path.is_dir() and find_token_reader(path) is not None) or (
            path.is_file() and path.name in ("token_reader.json", "token_reader.safetensors")):
        reader, vocab, weights = load_token_reader(path, device)
        return ASRBackend(model=reader.requires_grad_(False), vocab=vocab, source=weights)
    if path.is_dir() and (path / "token_reader.json").is_file() != (path / "token_reader.safetensors").is_file():
        raise InputError(f"{path} holds half a token reader (token_reader.json and token_reader.safetensors go "
                         f"together): give the `cadenza train token_reader --out` folder of a finished run")
    if path.is_file() and path.suffix == ".pt":
        ckpt_path, run = path, path.parent.parent
    elif path.is_dir():
        ckpt_path, run = latest_checkpoint(path), path
    else:
        raise InputError(f"ASR backend {path} not found: give the output folder of `cadenza train tokenizer` "
                         f"(asr_reward.tokenizer) or of `cadenza train token_reader` (asr_reward.reader)")
    json_path = run / CONFIG_NAME
    if not json_path.is_file():
        raise InputError(f"{run} has no {CONFIG_NAME}: give the output folder of a finished `cadenza train tokenizer` "
                         f"run (its export writes the tokenizer's sizes and character vocabulary there)")
    doc = read_speech_tokenizer_json(json_path)
    try:
        cfg = SpeechTokenizerConfig.from_dict(doc["config"])
    except (InputError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{json_path}: {exc}") from exc
    if cfg.frame_classes:
        raise InputError(f"{run} is a frame-classifier tokenizer (frame_classes {cfg.frame_classes}, e.g. "
                         f"cadenza-tiny v2's phoneme-per-frame tokens): it has no FSQ codes and no ASR head to compute "
                         f"L_ASR with; {READER_HINT}")
    vocab_doc = (doc.get("metadata") or {}).get("asr_vocab")
    if cfg.vocab_size < 2 or not isinstance(vocab_doc, dict):
        raise InputError(f"{json_path}: this tokenizer has no ASR head (vocab_size {cfg.vocab_size}, no asr_vocab): "
                         f"L_ASR needs a tokenizer trained with its CTC head by `cadenza train tokenizer`")
    if ckpt_path is None:
        raise InputError(f"{run} holds the exported tokenizer only (encoder + quantiser); the CTC head lives in the "
                         f"training run's checkpoints/step_N.pt, and there are none here: give the `cadenza train "
                         f"tokenizer --out` folder with its checkpoints")
    ckpt = load_checkpoint(ckpt_path)
    if ckpt.get("stage") != "tokenizer" or not isinstance(ckpt["state"].get("model"), dict):
        raise InputError(f"{ckpt_path} is a checkpoint of stage {ckpt.get('stage')!r}, not of the tokenizer stage")
    vocab = CharVocab.from_dict(vocab_doc)
    if len(vocab) != cfg.vocab_size:
        raise CheckpointError(f"{json_path}: asr_vocab has {len(vocab)} classes, the config says {cfg.vocab_size}")
    model = TokenASRBackend(cfg)
    model.load_supervised_state(ckpt["state"]["model"], str(ckpt_path))
    model = model.to(device).eval().requires_grad_(False)
    return ASRBackend(model=model, vocab=vocab, source=ckpt_path)


def speech_positions(targets: torch.Tensor, rows: torch.Tensor, batch_size: int, speech_vocab: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the scored LM positions predict speech tokens (not eos / fill), laid out per sequence.

    ``targets [N]``, ``rows [N]`` (row-major, as ``lm_model.targets_of`` gives them) -> ``(which [M]`` indices into
    the N scored positions, ``slot [M, 2]`` (row, position in that row's speech sequence), ``lengths [B])``.
    """
    which = (targets < speech_vocab).nonzero(as_tuple=True)[0]
    r = rows[which]
    lengths = torch.bincount(r, minlength=batch_size)
    starts = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(which.numel(), device=targets.device) - starts[r]
    return which, torch.stack([r, pos], 1), lengths


def asr_nll(backend: TokenASRBackend | TokenReader, speech_logits: torch.Tensor, slot: torch.Tensor, lengths: torch.Tensor,
            labels: list[list[int]], temperature: float, straight_through: bool = True,
            generator: torch.Generator | None = None, noise: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence CTC NLL ``[B]`` of ``labels`` through the Gumbel path, and whether each was feasible ``[B]``.

    ``speech_logits [M, V]``: LM logits of the speech positions (speech ids only), ``slot`` / ``lengths`` from
    ``speech_positions``; ``noise [M, V]``: the Gumbel draws (else drawn from ``generator``). An alignment the CTC
    cannot make (fewer frames than the transcript needs) counts 0.
    """
    b = lengths.numel()
    probs = gumbel_softmax_st(speech_logits, temperature, generator, straight_through, noise)
    t_max = max(1, int(lengths.max()) if lengths.numel() else 1)
    grid = probs.new_zeros(b, t_max, probs.shape[-1])
    grid = grid.index_put((slot[:, 0], slot[:, 1]), probs)
    mask = torch.arange(t_max, device=grid.device)[None, :] < lengths[:, None]
    log_probs = backend(grid, mask)  # [B, t_max * r, C]
    label_lengths = torch.tensor([len(x) for x in labels], device=grid.device)
    flat = torch.tensor([i for x in labels for i in x] or [BLANK], dtype=torch.long, device=grid.device)
    frames = lengths.clamp(min=1) * backend.frames_per_token
    nll = F.ctc_loss(log_probs.transpose(0, 1), flat, frames, label_lengths, blank=BLANK,
                     reduction="none", zero_infinity=True)
    feasible = (nll.detach() > 0) | (label_lengths == 0)  # zero_infinity turned impossible ones into 0
    return nll, feasible
