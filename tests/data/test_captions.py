import numpy as np

from speccap.data.captions import Cues, cue_levels, write_references
from speccap.data.emotions import detect_emotion


def _cues(**kw):
    base = dict(emotion="sad", gender="female", voice="en+f2", speech_language="en",
                text_en="The letter arrived three days late.", text_zh="那封信晚到了三天。",
                pitch=35.0, pitch_range=20.0, rate=120.0, volume=75.0, contour="falling",
                tremor=0.3, breathiness=0.0, harshness=0.0, pauses=1, noise_db=-40.0)
    base.update(kw)
    return Cues(**base)


def test_levels_follow_values():
    assert cue_levels(_cues())["pitch"] == "low"
    assert cue_levels(_cues(pitch=75))["pitch"] == "very_high"
    assert cue_levels(_cues(rate=200))["rate"] == "fast"
    assert cue_levels(_cues(volume=150))["volume"] == "loud"


def test_references_describe_the_rendered_cues_not_just_the_label():
    rng = np.random.default_rng(0)
    refs = write_references(_cues(), "en", 3, rng)
    assert len(refs) == 3 and len(set(refs)) == 3
    for r in refs:
        assert r.startswith("In the audio")
        assert "female" in r
        assert "low" in r  # pitch level is always described
        assert "trembling" in r or "shaky" in r  # tremor was rendered
        assert "pauses" in r
        assert detect_emotion(r, "en") == "sad"
    # same label, different rendering -> different description
    other = write_references(_cues(tremor=0.0, pauses=0, contour="steady", gender="male"), "en", 3,
                             np.random.default_rng(0))
    assert not any("trembling" in r or "shaky" in r for r in other)
    assert all("male" in r and "female" not in r for r in other)


def test_contour_and_quoted_words():
    refs = write_references(_cues(), "en", 3, np.random.default_rng(1))
    assert sum(("then" in r) for r in refs) == 3  # falling contour: "initially raised, then ..."
    assert all('"The letter arrived three days late"' in r for r in refs)
    zh = write_references(_cues(speech_language="zh"), "zh", 3, np.random.default_rng(1))
    assert all(r.startswith("在音频中") and "那封信晚到了三天" in r for r in zh)
    assert all(detect_emotion(r, "zh") == "sad" for r in zh)
    assert all("随后" in r or "之后" in r for r in zh)
    # English references of Mandarin speech say it was Mandarin
    en_of_zh = write_references(_cues(speech_language="zh"), "en", 2, np.random.default_rng(1))
    assert all("(in Mandarin)" in r for r in en_of_zh)
