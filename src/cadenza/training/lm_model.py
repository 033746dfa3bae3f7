"""The text-speech LM as one trainable ``nn.Module`` call: mixed-kind embedding + Qwen body + scores of chosen positions.

DDP only synchronises gradients of computations that go through the wrapped module's ``forward``, so everything
that touches parameters (the three embedding tables, the body, the decoder) happens in ``LMForTraining.forward``.
Only positions with a target are scored: the 6564-way decoder over every position of a long batch is most of the
activation memory otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import InputError
from cadenza.models.cosyvoice2.lm import SOS_ROW, TASK_ID_ROW, TextSpeechLM
from cadenza.training.lm_layout import IGNORE_ID, SOS, SPEECH, TASK_ID, TEXT, LMBatch


class LMForTraining(nn.Module):
    def __init__(self, lm: TextSpeechLM) -> None:
        super().__init__()
        self.lm = lm

    def embed(self, kinds: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """kinds, ids ``[B, L]`` -> embeddings ``[B, L, H]`` (padding positions are zeros)."""
        lm = self.lm
        weight = lm.llm_embedding.weight
        out = weight.new_zeros(*kinds.shape, weight.shape[1])
        text, speech = kinds == TEXT, kinds == SPEECH
        out = out.index_put((text.nonzero(as_tuple=True)), lm.llm.embed_tokens(ids[text]))
        out = out.index_put((speech.nonzero(as_tuple=True)), lm.speech_embedding(ids[speech]))
        for kind, row in ((SOS, SOS_ROW), (TASK_ID, TASK_ID_ROW)):
            where = (kinds == kind).nonzero(as_tuple=True)
            out = out.index_put(where, weight[row].expand(where[0].numel(), -1))
        return out

    def forward(self, kinds: torch.Tensor, ids: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        """kinds, ids ``[B, L]``; select bool ``[B, L]`` -> logits ``[N, speech_token_size + 3]`` of the N selected
        positions (row-major order). Causal attention; right padding never influences real positions."""
        hidden = self.lm.forward_hidden(self.embed(kinds, ids))
        return self.lm.logits(hidden[select])


def check_ids(batch: LMBatch, text_vocab: int, speech_vocab: int) -> None:
    for kind, limit, what in ((TEXT, text_vocab, "text"), (SPEECH, speech_vocab, "speech")):
        ids = batch.ids[batch.kinds == kind]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
            raise InputError(f"{what} token id {int(ids.max())} outside [0, {limit}): the data does not fit the model")


def targets_of(batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(select ``[B, L]`` bool, targets ``[N]``, row of each target ``[N]``)."""
    select = batch.targets != IGNORE_ID
    return select, batch.targets[select], select.nonzero(as_tuple=True)[0]


def sequence_log_probs(logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, batch_size: int,
                       average: bool = True) -> torch.Tensor:
    """Per-sequence ``log p(targets)`` ``[B]``: summed over each row's scored positions, or averaged over them.

    Only positions with a real target count (speech, eos, fill). The reference's DPO averages over the *ignored*
    positions instead (its mask is ``target == -1``, with ignored targets replaced by id 0), i.e. over the
    text/padding positions' log-probability of id 0, which carries no information about the speech; we do not.
    """
    logp = torch.gather(F.log_softmax(logits.float(), dim=-1), 1, targets.unsqueeze(1)).squeeze(1)
    total = logp.new_zeros(batch_size).index_add(0, rows, logp)
    if not average:
        return total
    count = logp.new_zeros(batch_size).index_add(0, rows, torch.ones_like(logp))
    return total / count.clamp(min=1)
