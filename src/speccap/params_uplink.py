"""The params of what leaves the device: the `uplink:` the edge sends and the `privacy:` stage that
measures what it reveals."""

from __future__ import annotations

from typing import Literal

from .params_types import Count, NonNegFloat, Normalize, params_class


@params_class
class LearnedUplinkParams:
    """An encoder on the edge trained with the cloud (speccap.models.learned_uplink); `uplink.merge`,
    `uplink.normalize` and `uplink.bits` apply to what it sends."""

    rows: Count = 16  # values sent per frame
    hidden: Count = 64  # the encoder's inner channels (its cost on the edge)
    adversary: NonNegFloat = 0.0  # reversed-gradient weight of a speaker classifier on what is sent (0: none)


@params_class
class UplinkParams:
    """What the edge sends the cloud in place of the audio (speccap.data.uplink): the log-mel, or a
    coarser view of it the cloud is trained on, or a learned encoding (`learned`). null bands, merge 1,
    normalize none, learned null: the log-mel."""

    bands: Count | None = None  # mel bands pooled into this many (null: all of features.n_mels)
    merge: Count = 1  # frames averaged into one
    normalize: Normalize = "none"  # clip: each band's mean and spread over the clip removed
    learned: LearnedUplinkParams | None = None  # an encoder learned with the cloud instead of pooled bands
    bits: Literal[2, 3, 4, 5, 6, 7, 8, 16] = 16  # per value sent: 16 = float16, fewer = quantised codes


@params_class
class PrivacyParams:
    clips: Count = 40  # test clips per language whose speech is rebuilt from each representation (the cost)
    train_clips: Count = 400  # train clips per language the voice classifiers learn from
    # uplinks measured beside the one the edge sends (`uplink`): coarser, with each band's clip
    # level and spread removed, and as few-bit codes
    candidates: tuple[UplinkParams, ...] = (
        UplinkParams(32), UplinkParams(8), UplinkParams(4), UplinkParams(128, 4), UplinkParams(128, 8),
        UplinkParams(128, 1, "clip"), UplinkParams(8, 1, "clip"), UplinkParams(128, 8, "clip"),
        UplinkParams(128, 16, "clip"), UplinkParams(128, 32, "clip"), UplinkParams(16, 16, "clip"),
        UplinkParams(128, 8, "clip", bits=4), UplinkParams(128, 8, bits=2), UplinkParams(128, 4, "clip", bits=2))
