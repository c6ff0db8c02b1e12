import pytest

from speccap.models.tokenizer import SPECIAL_TOKENS, load_tokenizer, save_tokenizer, special_ids, train_tokenizer

TEXTS = ["In the audio, a female speaker speaks with a raised tone. Therefore, the speaker exhibits anger.",
         "In the audio, a male speaker says \"The train leaves at seven\" with a low tone. Overall, sadness.",
         "在音频中，一位女性说话者语调上扬，语速很快。因此，说话者表现出愤怒的情绪。",
         "在音频中，一位男性说话者语调低沉，说：“火车明天早上七点出发”。可以判断说话者感到悲伤。"] * 5


def test_roundtrip_both_languages_and_fixed_special_ids(tmp_path):
    tok = train_tokenizer(TEXTS, 300)
    for text in TEXTS[:4]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = special_ids(tok)
    assert (ids.pad, ids.eos, ids.audio_start, ids.audio, ids.audio_end) == (0, 1, 4, 5, 6)
    save_tokenizer(tok, tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    assert again.encode(TEXTS[2]) == tok.encode(TEXTS[2])
    assert all(again.convert_tokens_to_ids(t) == i for i, t in enumerate(SPECIAL_TOKENS))


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer not found"):
        load_tokenizer(tmp_path)
