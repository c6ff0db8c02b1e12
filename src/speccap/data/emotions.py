"""The emotion inventory: the acoustic profile each emotion is rendered with, and the words that name it.

Profiles overlap on purpose (anger and fear are both fast, surprise and happiness both high), so
the emotion has to be read from several cues together, not from one level. Yet each pair that
shares levels differs in something audible (happiness rises and surprise falls and is higher and
wider; anger is louder and harsh; disgust is low, slow and harsh where neutral is plain; fear
trembles; sadness is breathy), so they are separable by ear, not only from the cue values:
`benchmarks/separability.py` measures both.
"""

from __future__ import annotations

from dataclasses import dataclass

EMOTIONS = ("neutral", "happy", "sad", "angry", "fearful", "surprised", "disgusted")


@dataclass(frozen=True)
class EmotionProfile:
    # (mean, std) of eSpeak's pitch 0-100, range 0-100, rate wpm, volume 0-200
    pitch: tuple[float, float]
    range: tuple[float, float]
    rate: tuple[float, float]
    volume: tuple[float, float]
    # probability of each voice-quality effect and its strength range
    tremor: tuple[float, float, float]  # (p, min depth, max depth)
    breathy: tuple[float, float, float]
    harsh: tuple[float, float, float]
    pause_probs: tuple[float, float, float]  # P(0, 1, 2 long pauses)
    contour_probs: dict[str, float]


PROFILES: dict[str, EmotionProfile] = {
    "neutral": EmotionProfile((50, 5), (48, 7), (165, 10), (100, 7), (0.0, 0, 0), (0.0, 0, 0),
                              (0.0, 0, 0), (0.8, 0.2, 0.0), {"steady": 0.9, "rising": 0.05, "falling": 0.05}),
    "happy": EmotionProfile((62, 5), (70, 7), (200, 12), (116, 9), (0.0, 0, 0), (0.0, 0, 0),
                            (0.0, 0, 0), (0.9, 0.1, 0.0), {"steady": 0.3, "rising": 0.7, "falling": 0.0}),
    "sad": EmotionProfile((35, 5), (22, 6), (124, 10), (78, 7), (0.4, 0.15, 0.3), (0.9, 0.35, 0.6),
                          (0.0, 0, 0), (0.3, 0.45, 0.25), {"steady": 0.5, "rising": 0.0, "falling": 0.5}),
    "angry": EmotionProfile((57, 6), (56, 8), (212, 12), (160, 10), (0.0, 0, 0), (0.0, 0, 0),
                            (0.9, 0.4, 0.9), (0.8, 0.2, 0.0), {"steady": 0.6, "rising": 0.3, "falling": 0.1}),
    "fearful": EmotionProfile((72, 5), (40, 7), (200, 12), (92, 8), (0.95, 0.3, 0.5), (0.5, 0.3, 0.5),
                              (0.0, 0, 0), (0.4, 0.4, 0.2), {"steady": 0.6, "rising": 0.3, "falling": 0.1}),
    "surprised": EmotionProfile((82, 5), (95, 4), (165, 12), (124, 9), (0.0, 0, 0), (0.0, 0, 0),
                                (0.0, 0, 0), (0.7, 0.3, 0.0), {"steady": 0.1, "rising": 0.0, "falling": 0.9}),
    "disgusted": EmotionProfile((40, 5), (32, 7), (135, 10), (108, 8), (0.0, 0, 0), (0.0, 0, 0),
                                (0.85, 0.25, 0.5), (0.5, 0.4, 0.1), {"steady": 0.6, "rising": 0.0, "falling": 0.4}),
}

# The word a conclusion names the emotion with, per caption language.
CONCLUSION_WORDS = {
    "en": {"neutral": "a neutral state", "happy": "happiness", "sad": "sadness", "angry": "anger",
           "fearful": "fear", "surprised": "surprise", "disgusted": "disgust"},
    "zh": {"neutral": "中性", "happy": "高兴", "sad": "悲伤", "angry": "愤怒", "fearful": "恐惧",
           "surprised": "惊讶", "disgusted": "厌恶"},
}

# Words that count as naming each emotion when scoring a caption (emotion-hit rate).
# Cue descriptions in the corpus never use these words, so the last one named is the verdict.
EMOTION_KEYWORDS = {
    "en": {
        "neutral": ("neutral",),
        "happy": ("happiness", "happy", "joy", "cheerful", "delight"),
        "sad": ("sadness", "sad", "sorrow", "grief", "unhappy"),
        "angry": ("anger", "angry", "rage", "furious", "irritat"),
        "fearful": ("fear", "afraid", "scared", "frighten", "terrified"),
        "surprised": ("surprise", "astonish", "amazed", "shock"),
        "disgusted": ("disgust", "revulsion", "repuls", "contempt"),
    },
    "zh": {
        "neutral": ("中性", "平静"),
        "happy": ("高兴", "快乐", "喜悦", "开心", "愉快"),
        "sad": ("悲伤", "难过", "伤心", "哀伤"),
        "angry": ("愤怒", "生气", "恼怒", "气愤"),
        "fearful": ("恐惧", "害怕", "惊恐"),
        "surprised": ("惊讶", "吃惊", "惊奇"),
        "disgusted": ("厌恶", "反感", "嫌弃"),
    },
}


def detect_emotion(caption: str, language: str) -> str | None:
    """The emotion a caption concludes with: the one whose keyword ends last (None if none).

    Ties on the end position go to the longer keyword, so 'unhappy' reads as sad, not happy.
    """
    text = caption.lower()
    best, best_key = None, (-1, 0)
    for emotion, words in EMOTION_KEYWORDS[language].items():
        for word in words:
            pos = text.rfind(word)
            if pos >= 0 and (pos + len(word), len(word)) > best_key:
                best, best_key = emotion, (pos + len(word), len(word))
    return best
