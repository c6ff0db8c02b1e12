from speccap.data.emotions import EMOTION_KEYWORDS, EMOTIONS, detect_emotion


def test_at_least_seven_emotions_each_with_keywords():
    assert len(EMOTIONS) >= 7
    for lang in ("en", "zh"):
        assert set(EMOTION_KEYWORDS[lang]) == set(EMOTIONS)


def test_last_named_emotion_wins():
    assert detect_emotion("It starts like surprise. Therefore, the speaker exhibits anger.", "en") == "angry"
    assert detect_emotion("The speaker sounds unhappy.", "en") == "sad"
    assert detect_emotion("因此，说话者表现出恐惧的情绪。", "zh") == "fearful"
    assert detect_emotion("no emotion words here", "en") is None
