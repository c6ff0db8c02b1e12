"""`AudioLM` over a Qwen-Omni thinker (Qwen2.5-Omni or Qwen3-Omni-MoE, any size).

The same class serves the real checkpoints (3B / 7B / 30B-A3B) and the embedded captioners
(tiny configs of the same HF classes trained here). Positions are Qwen's multimodal RoPE: the
prefill asks the model for its 3-D position ids and the offset ("rope delta") that text tokens
after the audio carry; every extension then passes explicit positions, so a session never
depends on state the HF model keeps between calls (two sessions of one model can interleave).
"""

from __future__ import annotations

import copy
import hashlib
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from . import fast_step, language_mask
from .base import AudioLM, Session, StepOutput, Summarize, fed_ranks


@dataclass
class PromptTemplate:
    """Token ids around the audio block, per caption language: prefix + audio + suffix."""

    prefix: dict[str, list[int]] = field(default_factory=dict)
    suffix: dict[str, list[int]] = field(default_factory=dict)

    def around(self, language: str) -> tuple[list[int], list[int]]:
        if language not in self.suffix:
            raise ValueError(f"no prompt for caption language {language!r} (have {sorted(self.suffix)})")
        return self.prefix.get(language, []), self.suffix[language]


def audio_token_count(model, n_frames: int) -> int:
    """How many audio placeholder tokens the model's audio encoder emits for `n_frames` mel frames."""
    tower = model.model.audio_tower
    lengths = torch.tensor([n_frames])
    if hasattr(tower, "_get_feat_extract_output_lengths"):  # Qwen2.5-Omni
        return int(tower._get_feat_extract_output_lengths(lengths)[1][0])
    fn = sys.modules[type(model).__module__]._get_feat_extract_output_lengths  # Qwen3-Omni-MoE
    return int(fn(lengths, n_window=model.config.audio_config.n_window)[0])


class ThinkerLM(AudioLM):
    def __init__(self, model, tokenizer, prompt: PromptTemplate, eos_token_id: int, name: str = "thinker"):
        self.model = model.eval()
        self._tokenizer = tokenizer
        self.prompt = prompt
        self._eos = eos_token_id
        self.name = name
        cfg = model.config
        self.audio_start_id = cfg.audio_start_token_id
        self.audio_end_id = getattr(cfg, "audio_end_token_id", None) or cfg.audio_start_token_id + 1
        self.audio_id = cfg.audio_token_id
        self._vocab = cfg.get_text_config().vocab_size
        self._blocked: dict[tuple[str, int], torch.Tensor] = {}
        # sessions extend through models.fast_step where it applies (False: always HF's forward)
        self.use_fast_step = True
        self._fast: fast_step.FastStep | None | bool = None  # None: not decided yet; False: not supported
        # prompts kept across the captions of one clip (a sweep decodes each clip once per configuration);
        # None: every session prefills its own
        self.prompts: PromptCache | None = None
        # the audio encoder's output per clip, kept the same way (None: every prefill encodes its clips)
        self.audio: AudioCache | None = None

    def fast(self) -> "fast_step.FastStep | None":
        """The lean decoding step over this model's weights, when it applies now. Whether the model
        supports it is decided once, at the first extension (it reads the config: microseconds that
        every token would pay); only the training flag is looked at on every call."""
        if not self.use_fast_step or self.model.training:
            return None
        if self._fast is None:
            self._fast = fast_step.FastStep(self.model) if fast_step.supports(self.model) else False
        return self._fast or None

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.vocab_limit or self._vocab

    @property
    def eos_token_id(self) -> int:
        return self._eos

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self._tokenizer, "pad_token_id", None)
        return pad if pad is not None else (self.model.config.get_text_config().pad_token_id or 0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def prompt_ids(self, n_frames: int, language: str) -> list[int]:
        prefix, suffix = self.prompt.around(language)
        n_audio = audio_token_count(self.model, n_frames)
        return prefix + [self.audio_start_id] + [self.audio_id] * n_audio + [self.audio_end_id] + suffix

    def blocked_ids(self, language: str) -> torch.Tensor:
        """Token ids a caption in `language` may not contain (models.language_mask); the vocab
        limit can change after loading (shared_vocab), so the mask is kept per size."""
        key = (language, self.vocab_size)
        if key not in self._blocked:
            self._blocked[key] = language_mask.blocked_ids(self._tokenizer, self.vocab_size, language,
                                                           self._eos).to(self.device)
        return self._blocked[key]

    def start(self, features: np.ndarray, language: str, hidden: bool = False,
              summarize: Summarize | None = None) -> "ThinkerSession":
        sess = ThinkerSession(self, features, language, hidden)
        if summarize is not None:
            sess.prefill_summary = summarize(sess.prefill_logits[None])[0]
        return sess

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


@dataclass
class Prompts:
    """ONE forward of a thinker over the audio and prompt of each of a batch of clips (`prefill`):
    the model's output (logits, `past_key_values`, hidden states when asked for), right-padded to the
    longest prompt, and each clip's prompt length, rope delta and blocked ids."""

    out: object
    lengths: list[int]
    deltas: list[int]
    blocked: list[torch.Tensor]

    def first_logits(self, lm: ThinkerLM, i: int) -> torch.Tensor:
        """(V,) clip i's distribution of the first caption token, its blocked ids masked."""
        return language_mask.apply(self.out.logits[i, self.lengths[i] - 1, : lm.vocab_size].float(), self.blocked[i])

    def first_hidden(self, i: int) -> torch.Tensor:
        """(H,) clip i's last-layer state at its prompt's last position (what drafts the first token)."""
        return self.out.hidden_states[-1][i, self.lengths[i] - 1].float()


def prefill(lm: ThinkerLM, clips: list[tuple[np.ndarray, str]], hidden: bool = False) -> Prompts:
    """The audio encoder and prompt of every (features (n_mels, frames), language) in one forward,
    padded to the longest; with `hidden`, every layer's states are kept (the last one's at each
    prompt's end is what a token gate reads before the first token). One clip is a session's start;
    many are a batch prefill (batching.row_pool), equal to their starts alone within float rounding."""
    model, dev = lm.model, lm.device
    feats = [np.asarray(f, np.float32) for f, _ in clips]
    for f in feats:
        if f.ndim != 2:
            raise ValueError(f"audio features must be (n_mels, frames), got shape {tuple(f.shape)}")
    b, frames = len(feats), [f.shape[1] for f in feats]
    prompts = [lm.prompt_ids(n, language) for n, (_, language) in zip(frames, clips)]
    x = torch.zeros((b, feats[0].shape[0], max(frames)))
    fmask = torch.zeros((b, max(frames)), dtype=torch.long)
    ids = torch.full((b, max(map(len, prompts))), lm.pad_token_id)
    attn = torch.zeros_like(ids)
    for i, (f, prompt) in enumerate(zip(feats, prompts)):
        x[i, :, : f.shape[1]] = torch.from_numpy(f)
        fmask[i, : f.shape[1]] = 1
        ids[i, : len(prompt)] = torch.tensor(prompt)
        attn[i, : len(prompt)] = 1
    ids, attn, fmask = ids.to(dev), attn.to(dev), fmask.to(dev)
    positions, delta = model.model.get_rope_index(ids, None, None, attn, False, fmask.sum(-1), None)
    if lm.audio is None:
        audio = encode_audio(lm, x.to(device=dev, dtype=lm.dtype), fmask)
    else:
        width = chunk_width(lm, max(frames))
        audio = torch.cat([lm.audio.get(lm, f, width, alone=b == 1) for f in feats])
    # the placeholders' embeddings replaced by the audio encoding, as the model's own forward does
    embeds = model.get_input_embeddings()(ids)
    at = (ids == lm.audio_id).unsqueeze(-1).expand_as(embeds)
    embeds = embeds.masked_scatter(at, audio.to(embeds.device, embeds.dtype))
    out = model(inputs_embeds=embeds, attention_mask=attn, position_ids=positions, use_cache=True,
                output_hidden_states=hidden)
    return Prompts(out, [len(p) for p in prompts], [int(d) for d in delta.reshape(b, -1)[:, 0]],
                   [lm.blocked_ids(language) for _, language in clips])


def encode_audio(lm: ThinkerLM, x: torch.Tensor, fmask: torch.Tensor) -> torch.Tensor:
    """(sum of audio tokens, hidden): the audio encoder over a padded batch of features (b, n_mels,
    frames) with its frame mask, every clip's tokens one after another."""
    return lm.model.get_audio_features(x, fmask, return_dict=True).last_hidden_state


def chunk_frames(lm: ThinkerLM) -> int:
    """Both Qwen-Omni audio encoders cut a clip into chunks of 2 x n_window frames (the last one
    shorter) and pad every chunk of a batch to the longest."""
    return 2 * lm.model.config.audio_config.n_window


def chunk_width(lm: ThinkerLM, longest: int) -> int:
    """The frames every chunk is padded to when the encoder reads a batch whose longest clip has
    `longest` frames."""
    return min(chunk_frames(lm), longest)


class AudioCache:
    """The audio encoder's output per clip of one model, kept across captions, least recently used
    dropped past `max_bytes`. The encoder cuts a batch's clips into chunks, pads every chunk to the
    batch's longest (`chunk_width`) and attends within each chunk. A clip of several chunks is
    therefore encoded the same whatever its batch; a clip of one chunk depends on the width its
    batch pads it to, and on whether it is the encoder's only chunk (then its attention takes
    another path). So each clip is encoded without the others, but padded as its batch pads it
    (beside a silent clip of that width where its batch had others), and kept under that width.
    On CPU that gives it the bits its batch gives it (tests/models/test_thinker.py), so keeping
    them changes no caption, record or trace feature: a sweep's configurations decode the same
    clips, and every one after the first skips the audio encoder (the prompt's text forward still
    runs in the caption's own batch)."""

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"an audio cache needs room: max_bytes = {max_bytes}")
        self.max_bytes, self.nbytes = max_bytes, 0
        self.hits = self.misses = 0
        self._kept: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def get(self, lm: ThinkerLM, features: np.ndarray, width: int, alone: bool) -> torch.Tensor:
        """(audio tokens, hidden) for the features (n_mels, frames) in a batch that pads chunks to
        `width` frames (its `chunk_width`) and holds other clips unless `alone`; shared: callers do
        not change it."""
        feats = np.ascontiguousarray(features, np.float32)
        frames = feats.shape[1]
        one_chunk = frames <= chunk_frames(lm)
        key = (hashlib.blake2b(feats.tobytes(), digest_size=16).digest(), feats.shape,
               (width, alone) if one_chunk else None)
        if key in self._kept:
            self.hits += 1
            self._kept.move_to_end(key)
            return self._kept[key]
        self.misses += 1
        beside = one_chunk and not alone  # a silent clip of the batch's width beside it
        x = torch.zeros((1 + beside, feats.shape[0], max(frames, width)))
        fmask = torch.zeros((1 + beside, x.shape[2]), dtype=torch.long)
        x[0, :, :frames], fmask[0, :frames] = torch.from_numpy(feats), 1
        fmask[1:, :width] = 1
        made = encode_audio(lm, x.to(device=lm.device, dtype=lm.dtype), fmask.to(lm.device))
        made = made[: audio_token_count(lm.model, frames)].clone() if beside else made
        self._kept[key] = made
        self.nbytes += made.numel() * made.element_size()
        while self.nbytes > self.max_bytes and len(self._kept) > 1:
            gone = self._kept.popitem(last=False)[1]
            self.nbytes -= gone.numel() * gone.element_size()
        return made


@dataclass(frozen=True)
class Prompt:
    """One clip's prompt forward, alone: its keys and values (a cache of batch one, never extended
    in place: a session extends a copy), the first caption token's masked logits and, when asked
    for, the last-layer state that drafts it."""

    kv: object
    first_logits: torch.Tensor
    first_hidden: torch.Tensor | None
    length: int
    delta: int
    blocked: torch.Tensor

    @classmethod
    def alone(cls, lm: ThinkerLM, features: np.ndarray, language: str, hidden: bool) -> Prompt:
        start = prefill(lm, [(features, language)], hidden)
        return cls(start.out.past_key_values, start.first_logits(lm, 0), start.first_hidden(0) if hidden else None,
                   start.lengths[0], start.deltas[0], start.blocked[0])

    @property
    def nbytes(self) -> int:
        tensors = [t for layer in self.kv.layers for t in (layer.keys, layer.values)] + [self.first_logits]
        return sum(t.numel() * t.element_size() for t in tensors + ([self.first_hidden] if self.first_hidden is not None
                                                                        else []))


class PromptCache:
    """Prompts of one model kept across captions, least recently used dropped past `max_bytes`.
    Each is computed alone, so a caption's prompt is the same bits whichever batch, process or
    order asked for it first (and the same as a session's own): a sweep's configurations decode
    the same clips, and every one after the first skips the audio encoder and prompt."""

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"a prompt cache needs room: max_bytes = {max_bytes}")
        self.max_bytes, self.nbytes = max_bytes, 0
        self.hits = self.misses = 0
        self._kept: OrderedDict[tuple, Prompt] = OrderedDict()

    def get(self, lm: ThinkerLM, features: np.ndarray, language: str, hidden: bool = False) -> Prompt:
        """The prompt of (features, language) for `lm` (its hidden state kept when `hidden`); shared:
        callers copy what they extend."""
        feats = np.ascontiguousarray(features, np.float32)
        key = (hashlib.blake2b(feats.tobytes(), digest_size=16).digest(), feats.shape, language, bool(hidden),
               lm.vocab_size)
        if key in self._kept:
            self.hits += 1
            self._kept.move_to_end(key)
            return self._kept[key]
        self.misses += 1
        made = Prompt.alone(lm, feats, language, hidden)
        self._kept[key] = made
        self.nbytes += made.nbytes
        while self.nbytes > self.max_bytes and len(self._kept) > 1:
            self.nbytes -= self._kept.popitem(last=False)[1].nbytes
        return made


class ThinkerSession(Session):
    @torch.inference_mode()
    def __init__(self, lm: ThinkerLM, features: np.ndarray, language: str, hidden: bool = False):
        self.lm = lm
        self.device = lm.device  # a walk over the parameters: once a session, not once a token
        if lm.prompts is None:
            start = Prompt.alone(lm, features, language, hidden)
        else:  # the kept prompt's bits, in tensors of this session's own
            start = copy.deepcopy(lm.prompts.get(lm, features, language, hidden))
        self.cache = start.kv
        # the state that drafts the first caption token (what a token gate reads before it); asked
        # for only then: every layer's states over the whole prompt are collected to give it
        self.prefill_hidden = start.first_hidden
        self.prompt_len, self.rope_delta, self.blocked = start.length, start.delta, start.blocked
        self.prefill_logits = start.first_logits

    @property
    def length(self) -> int:
        return self.cache.get_seq_length() - self.prompt_len

    @torch.inference_mode()
    def extend(self, token_ids: list[int], return_hidden: bool = False,
               summarize: Summarize | None = None, rank_after: torch.Tensor | None = None) -> StepOutput:
        if not token_ids:
            raise ValueError("extend() needs at least one token")
        n = len(token_ids)
        start = self.cache.get_seq_length()
        device = self.device
        positions = torch.arange(start, start + n, device=device) + self.rope_delta
        fast = self.lm.fast()
        if fast is not None:
            logits, hidden = fast.step(torch.tensor(token_ids, device=device), positions, self.cache)
        else:
            out = self.lm.model(input_ids=torch.tensor([token_ids], device=device), past_key_values=self.cache,
                                position_ids=positions.view(1, 1, n).expand(3, 1, n), use_cache=True,
                                output_hidden_states=return_hidden)
            self.cache = out.past_key_values
            logits, hidden = out.logits[0], (out.hidden_states[-1][0] if return_hidden else None)
        made = step_output(self.lm, self.blocked, logits, hidden, return_hidden)
        if summarize is not None:
            made.summary = summarize(made.logits[-1:])[0]
        if rank_after is not None:
            made.ranks = fed_ranks([rank_after], [made.logits], [list(token_ids)])[0]
        return made

    def rollback(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot roll back {n} tokens: the session holds {self.length} caption tokens")
        if n:
            # a negative count removes that many tokens, in transformers 4.x and 5.x alike
            # (5.x refuses a positive max-length)
            self.cache.crop(-n)


def step_output(lm: ThinkerLM, blocked: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor | None,
                return_hidden: bool) -> StepOutput:
    """What an extension returns for the model's raw (n, vocab) logits and (n, hidden) states: the
    logits over the shared vocabulary with the caption's `blocked` ids masked, float32."""
    hidden = hidden.float() if return_hidden else None
    return StepOutput(language_mask.apply(logits[:, : lm.vocab_size].float(), blocked), hidden)
