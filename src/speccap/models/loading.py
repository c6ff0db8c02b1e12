"""Loading an `AudioLM` for a role (edge or cloud) from params.

- embedded: the captioner the train stage wrote to `models/<role>/` with `models/tokenizer/`.
- qwen2_5_omni / qwen3_omni_moe: a real thinker checkpoint from a local path (or a hub id
  already in the local cache; nothing is downloaded here), prompted with the papers' English /
  Chinese prompts in Qwen's chat format; text output only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..config import ModelParams, Params
from ..data.uplink import Uplink
from .checkpoint_paths import ModelLoadError, checkpoint_missing
from .configs import model_class
from .learned_uplink import UPLINK_FILE, LearnedUplink
from .thinker import PromptTemplate, ThinkerLM
from .tokenizer import LANG_TOKENS, load_tokenizer

# The papers' prompts (UGSD, Table 1), used with the real Qwen-Omni checkpoints.
PAPER_PROMPTS = {
    "en": ("As an expert in the field of emotions, please focus on the acoustic information in the audio to discern "
           "clues related to the emotions of the individual. Please provide a detailed description and ultimately "
           "predict the emotional state of the individual. In the audio, respond in English only, use third person, "
           "avoid dialogue style. Example: \"In the audio, the speaker's tone is raised with rapid pacing, expressing "
           "dissatisfaction. Therefore, the speaker exhibits frustration and impatience.\""),
    "zh": ("任务：请基于给定音频，输出一句“情感说明短句”。 必须遵守：只输出一句中文短句（12-30个汉字），以“。”结尾；"
           "句子中同时包含一个主要情绪和一个简短的声学或韵律线索（如语气、语速、强弱、音高变化等类别层面的描述即可），"
           "但不要解释或列举；不要出现客套话、邀请继续对话、表情符号、英文、Markdown、标号或代码；不要提及“音频”“模型”“分析”或“我”；"
           "若存在多种可能性，只选择最可能的一种，不要并列罗列。只给出最终这一句短句，不要输出其他内容。"),
}
SYSTEM_PROMPT = "You are a helpful assistant."
SENT_DIR = "uplink"  # in the edge model's folder: the learned encoder the edge sends through


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def qwen_chat_template(tokenizer, prompts: dict[str, str] = PAPER_PROMPTS) -> PromptTemplate:
    """Qwen chat format around the audio block: system turn, user turn (audio + prompt), assistant."""
    prefix = tokenizer.encode(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n",
                              add_special_tokens=False)
    suffix = {lang: tokenizer.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
              for lang, text in prompts.items()}
    return PromptTemplate(prefix={lang: prefix for lang in prompts}, suffix=suffix)


def load_real(role: str, spec: ModelParams, device: str | None = None) -> ThinkerLM:
    """A real Qwen-Omni thinker checkpoint; a clear error naming the param when it is not there."""
    from transformers import AutoTokenizer
    problem = checkpoint_missing(role, spec)
    if problem:
        raise ModelLoadError(problem)
    param, path = f"models.{role}.path", spec.path
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = model_class(spec.backend).from_pretrained(path, dtype=_dtype(spec.dtype, dev))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{param}: could not load {spec.backend} thinker from {path!r} "
                             f"(no download is attempted where there is no internet): {exc}") from exc
    model.to(dev)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return ThinkerLM(model, tokenizer, qwen_chat_template(tokenizer), eos, name=f"{role}:{Path(path).name}")


def embedded_prompt(tokenizer) -> PromptTemplate:
    return PromptTemplate(suffix={lang: [tokenizer.convert_tokens_to_ids(t)] for lang, t in LANG_TOKENS.items()})


def load_embedded(role: str, models_dir: str | os.PathLike) -> ThinkerLM:
    models_dir = Path(models_dir)
    model_dir = models_dir / role
    if not (model_dir / "config.json").is_file():
        raise ModelLoadError(f"{model_dir}: no trained {role} captioner (run `dvc repro train`)")
    tokenizer = load_tokenizer(models_dir / "tokenizer")
    family = json.loads((model_dir / "config.json").read_text())["model_type"]
    family = {"qwen2_5_omni_thinker": "qwen2_5_omni", "qwen3_omni_moe_thinker": "qwen3_omni_moe"}.get(family, family)
    model = model_class(family).from_pretrained(str(model_dir), dtype=torch.float32)
    lm = ThinkerLM(model, tokenizer, embedded_prompt(tokenizer), tokenizer.eos_token_id, name=f"{role}:embedded")
    lm.uplink = read_uplink(model_dir)
    lm.sends = read_uplink(model_dir / SENT_DIR)
    return lm


def read_uplink(model_dir: Path) -> Uplink | LearnedUplink:
    """The uplink a captioner was trained to read (UPLINK_FILE beside its weights, with a learned one's
    encoder; none: the log-mel). Also what an edge ships to send (`SENT_DIR` of the edge model)."""
    path = model_dir / UPLINK_FILE
    if not path.is_file():
        return Uplink()
    try:
        described = json.loads(path.read_text())
        if "learned" in described:
            return LearnedUplink.load(model_dir, described)
        return Uplink(**described)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelLoadError(f"{path}: not an uplink description ({exc})") from exc


def load_role(params: Params, role: str, device: str | None = None) -> ThinkerLM:
    spec: ModelParams = getattr(params.models, role)
    if spec.backend == "embedded":
        return load_embedded(role, params.models.dir)
    return load_real(role, spec, device)
