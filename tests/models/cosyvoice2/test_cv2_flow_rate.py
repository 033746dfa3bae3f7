"""``FrameRate`` (the flow's speaking rate, ``speed_method="flow"``): where each estimator frame reads ``mu``.

The whole-utterance resampling must equal ``F.interpolate(linear)`` with the scale fixed to the speed (what the flow
was trained on), the prompt frames must stay as they are, and frames computed piece by piece as ``mu`` grows
(``ready``) must equal the whole computation — the property streaming rests on (the streams themselves are checked
against recomputation in ``test_cv2_stream_property.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadenza.models.cosyvoice2.flow_rate import FrameRate


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.5, 2.0])
@pytest.mark.parametrize("fixed", [0, 7])
def test_the_whole_resampling_is_linear_interpolation_at_the_speed(speed, fixed):
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(1, 3, fixed + 41, generator=g)
    rate = FrameRate(speed, fixed)
    total = rate.total(mu.size(2))
    out = rate.resample(mu, 0, 0, total, mu.size(2))
    spoken = F.interpolate(mu[:, :, fixed:], scale_factor=1 / speed, mode="linear", recompute_scale_factor=False)
    assert total == fixed + spoken.size(2) == fixed + int(41 / speed)
    torch.testing.assert_close(out[:, :, :fixed], mu[:, :, :fixed])  # the prompt's frames keep their rate
    torch.testing.assert_close(out[:, :, fixed:], spoken)


@pytest.mark.parametrize("speed", [0.5, 1.3, 2.0])
def test_frames_ready_as_mu_grows_equal_the_whole(speed):
    """Each prefix of ``mu`` gives ``ready`` frames that never change when more ``mu`` arrives; the rest at the end."""
    fixed, n = 5, 60
    mu = torch.randn(1, 2, n, generator=torch.Generator().manual_seed(1))
    rate = FrameRate(speed, fixed)
    whole = rate.resample(mu, 0, 0, rate.total(n), n)
    done, pieces = 0, []
    for end in (3, 6, 7, 19, 20, 33, 59):
        ready = rate.ready(end)
        assert ready >= done and (end <= fixed or rate.source(torch.tensor([ready]))[0] > end - 1)
        base = rate.first_needed(done) if done < ready else 0
        pieces.append(rate.resample(mu[:, :, base:end], base, done, ready, end))
        done = ready
    pieces.append(rate.resample(mu, 0, done, rate.total(n), n))
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole)


def test_bad_rates_and_missing_frames_are_refused():
    with pytest.raises(ValueError, match="speed must be between 0.5 and 2.0"):
        FrameRate(3.0, 0)
    with pytest.raises(ValueError, match="speed must be between"):
        FrameRate(float("nan"), 0)
    rate = FrameRate(2.0, 0)
    with pytest.raises(ValueError, match="need mu frames"):
        rate.resample(torch.zeros(1, 1, 4), 10, 0, 4, 14)  # frames 0.. read mu 0.., the buffer starts at 10
