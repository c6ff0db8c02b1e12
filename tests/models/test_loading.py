import pytest

from speccap.config import ModelParams, params_from_dict
from speccap.models.configs import SpecialIds, build_model
from speccap.models.loading import PAPER_PROMPTS, ModelLoadError, load_embedded, load_real, load_role
from speccap.models.qwen_vocab import QWEN_OMNI_SPECIAL, qwen_tokenizer_offline

from .conftest import TINY

QWEN_IDS = SpecialIds(audio=151646, audio_start=151647, audio_end=151648, image=151655, video=151656,
                      vision_start=151652, vision_end=151653, pad=151643, eos=151645)


@pytest.fixture(params=["qwen2_5_omni", "qwen3_omni_moe"])
def checkpoint(request, tmp_path):
    """A tiny thinker of the real class with Qwen's real vocabulary, saved like a hub checkpoint."""
    family = request.param
    model = build_model(family, 151936, TINY, QWEN_IDS)
    model.save_pretrained(str(tmp_path / "ckpt"))
    qwen_tokenizer_offline().save_pretrained(str(tmp_path / "ckpt"))
    return family, tmp_path / "ckpt"


def test_real_checkpoint_loads_with_the_papers_prompts(checkpoint, mel):
    family, path = checkpoint
    lm = load_real("cloud", ModelParams(backend=family, path=str(path)))
    assert lm.eos_token_id == QWEN_OMNI_SPECIAL["<|im_end|>"] and lm.vocab_size == 151936
    ids = lm.prompt_ids(230, "en")
    text = lm.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert PAPER_PROMPTS["en"] in text and "<|audio_bos|>" in text
    assert PAPER_PROMPTS["zh"] in lm.tokenizer.decode(lm.prompt_ids(230, "zh"))
    s = lm.start(mel, "zh")
    out = s.extend(lm.tokenizer.encode("说话者很生气"))
    assert out.logits.shape[1] == 151936
    s.rollback(2)
    assert s.length == len(lm.tokenizer.encode("说话者很生气")) - 2


def test_missing_checkpoint_names_the_param(tmp_path):
    with pytest.raises(ModelLoadError, match="models.edge.path: checkpoint folder .*/nope not found"):
        load_real("edge", ModelParams(backend="qwen2_5_omni", path=str(tmp_path / "nope")))
    with pytest.raises(ModelLoadError, match="models.cloud.path: could not load"):
        load_real("cloud", ModelParams(backend="qwen2_5_omni", path=str(tmp_path)))  # exists, holds nothing


def test_params_demand_a_path_for_real_backends():
    from speccap.config import ConfigError
    with pytest.raises(ConfigError, match="models.cloud.path"):
        params_from_dict({"models": {"cloud": {"backend": "qwen3_omni_moe"}}})


def test_embedded_models_missing(tmp_path):
    with pytest.raises(ModelLoadError, match="no trained edge captioner"):
        load_embedded("edge", tmp_path)
    p = params_from_dict({"models": {"dir": str(tmp_path)}})
    with pytest.raises(ModelLoadError, match="no trained cloud captioner"):
        load_role(p, "cloud")
