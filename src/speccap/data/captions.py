"""Reference captions written from the cues a clip was actually rendered with.

A `Cues` record holds the values the renderer used (eSpeak prosody per segment, voice-quality
effects, pauses, speaker gender, the words). Captions are built from those values binned into
words, so two clips with the same label but different rendering get different references, in
the style of the papers' prompt example ("In the audio, the speaker's tone is raised with rapid
pacing ... Therefore, the speaker exhibits ...").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .emotions import CONCLUSION_WORDS


@dataclass(frozen=True)
class Cues:
    emotion: str
    gender: str  # male | female
    voice: str
    speech_language: str  # en | zh: the language spoken
    text_en: str
    text_zh: str
    pitch: float  # mean eSpeak pitch over segments (0-100, 50 = the voice's normal)
    pitch_range: float
    rate: float  # words per minute
    volume: float  # 0-200, 100 normal
    contour: str  # steady | rising | falling (second part relative to the first)
    tremor: float  # amplitude-modulation depth, 0 = none
    breathiness: float  # breath-noise level, 0 = none
    harshness: float  # soft-clipping drive, 0 = none
    pauses: int  # long pauses inserted between phrases
    noise_db: float  # background noise level relative to speech, dB

    def to_dict(self) -> dict:
        return asdict(self)


def _level(value: float, cuts: tuple[float, ...], names: tuple[str, ...]) -> str:
    return names[int(np.searchsorted(cuts, value, side="right"))]


def cue_levels(c: Cues) -> dict[str, str]:
    """Bin the rendered values into the words the captions use."""
    return {
        "pitch": _level(c.pitch, (43, 58, 70), ("low", "moderate", "high", "very_high")),
        "range": _level(c.pitch_range, (32, 62), ("flat", "normal", "wide")),
        "rate": _level(c.rate, (145, 185), ("slow", "moderate", "fast")),
        "volume": _level(c.volume, (88, 128), ("soft", "normal", "loud")),
    }


_EN = {
    "pitch": {"low": ["a low tone", "a low, deep pitch"], "moderate": ["a moderate pitch", "an even tone"],
              "high": ["a raised tone", "a raised pitch"], "very_high": ["a very high pitch", "a sharply raised tone"]},
    "range": {"flat": ["a flat, monotonous intonation", "little pitch variation"], "normal": [],
              "wide": ["a lively, widely varying intonation", "large pitch swings"]},
    "rate": {"slow": ["slow pacing", "a slow speaking rate"], "moderate": ["steady pacing", "a moderate speaking rate"],
             "fast": ["rapid pacing", "a fast speaking rate"]},
    "volume": {"soft": ["a soft, quiet voice", "low volume"], "normal": ["normal volume"],
               "loud": ["a loud voice", "high volume"]},
    "tremor": ["a trembling voice", "a shaky, quivering voice"],
    "breathiness": ["a breathy voice", "audible breathiness"],
    "harshness": ["a harsh, strained voice quality", "a tense, rough voice"],
    "pauses": ["hesitant delivery with long pauses", "noticeable pauses between phrases"],
    "contour": {"rising": ["The voice starts calm, then rises in pitch and intensity.",
                           "Initially even, the tone then becomes raised."],
                "falling": ["The tone is initially raised, then settles down.",
                            "It starts high and forceful, then drops lower."],
                "steady": []},
    "interp": {"neutral": "in a matter-of-fact manner", "happy": "sounding upbeat and lively",
               "sad": "sounding downcast and low in energy", "angry": "expressing dissatisfaction",
               "fearful": "sounding tense and uneasy", "surprised": "sounding taken aback",
               "disgusted": "sounding repelled"},
    "conclusion": ["Therefore, the speaker exhibits {e}.", "The speaker's emotional state is best described as {e}.",
                   "Overall, the voice conveys {e}."],
}

_ZH = {
    "pitch": {"low": ["语调低沉", "音调较低"], "moderate": ["语调适中", "音调平稳"],
              "high": ["语调上扬", "音调较高"], "very_high": ["音调很高", "语调尖锐高亢"]},
    "range": {"flat": ["语调平淡单一", "音高变化很小"], "normal": [], "wide": ["语调起伏很大", "抑扬顿挫明显"]},
    "rate": {"slow": ["语速缓慢", "说话很慢"], "moderate": ["语速平稳", "语速适中"], "fast": ["语速很快", "语速急促"]},
    "volume": {"soft": ["声音轻柔", "音量较小"], "normal": ["音量正常"], "loud": ["音量很大", "声音洪亮"]},
    "tremor": ["声音颤抖", "声音发颤"],
    "breathiness": ["带有明显的气声", "声音发虚"],
    "harshness": ["嗓音粗糙紧绷", "声音生硬刺耳"],
    "pauses": ["说话断断续续，有明显停顿", "句间停顿较长"],
    "contour": {"rising": ["起初语气平缓，随后逐渐升高", "开始时语调平稳，之后变得高昂"],
                "falling": ["起初语调上扬，随后逐渐回落", "开始时声音高而有力，之后慢慢降低"],
                "steady": []},
    "interp": {"neutral": "语气就事论事", "happy": "显得轻快活泼", "sad": "显得低落消沉", "angry": "流露出不满",
               "fearful": "显得紧张不安", "surprised": "显得出乎意料", "disgusted": "显得很排斥"},
    "conclusion": ["因此，说话者表现出{e}的情绪。", "综合来看，说话者的情绪是{e}。", "可以判断说话者感到{e}。"],
}


def _pick(rng: np.random.Generator, options: list[str]) -> str | None:
    return options[int(rng.integers(len(options)))] if options else None


def _cue_phrases(c: Cues, table: dict, rng: np.random.Generator, keep_levels: float) -> list[str]:
    """Phrases for the cues: pitch always; other level cues with probability `keep_levels`;
    voice-quality effects whenever rendered (they are what makes a clip distinct)."""
    levels = cue_levels(c)
    phrases = [_pick(rng, table["pitch"][levels["pitch"]])]
    for name in ("rate", "volume", "range"):
        if rng.random() < keep_levels:
            phrases.append(_pick(rng, table[name][levels[name]]))
    for name, value in (("tremor", c.tremor), ("breathiness", c.breathiness),
                        ("harshness", c.harshness), ("pauses", c.pauses)):
        if value > 0:
            phrases.append(_pick(rng, table[name]))
    return [p for p in phrases if p]


def _join_en(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _quote(c: Cues, language: str) -> str:
    words = c.text_en if language == "en" else c.text_zh
    if language == "en":
        words = words.rstrip(".")
        return f'"{words}"' + (" (in Mandarin)" if c.speech_language != "en" else "")
    words = words.rstrip("。")
    return f"“{words}”" + ("（用英语）" if c.speech_language != "zh" else "")


def _english(c: Cues, rng: np.random.Generator, style: int) -> str:
    t = _EN
    who = f"a {c.gender} speaker"
    pron = "he" if c.gender == "male" else "she"
    cues = _cue_phrases(c, t, rng, keep_levels=0.8)
    contour = _pick(rng, t["contour"][c.contour])
    emo = CONCLUSION_WORDS["en"][c.emotion]
    end = _pick(rng, t["conclusion"]).format(e=emo)
    quote = _quote(c, "en")
    if style == 0:
        s = f"In the audio, {who} speaks with {_join_en(cues)}, {t['interp'][c.emotion]}."
        s += f" {contour}" if contour else ""
        return f"{s} {pron.capitalize()} says {quote}. {end}"
    if style == 1:
        s = f"In the audio, the speaker's voice has {_join_en(cues)}."
        s += f" {contour}" if contour else ""
        return f"{s} The {c.gender} speaker says {quote}, {t['interp'][c.emotion]}. {end}"
    s = f"In the audio, {who} says {quote} with {_join_en(cues)}."
    s += f" {contour}" if contour else ""
    return f"{s} {end}"


def _chinese(c: Cues, rng: np.random.Generator, style: int) -> str:
    t = _ZH
    who = "男性" if c.gender == "male" else "女性"
    pron = "他" if c.gender == "male" else "她"
    cues = "，".join(_cue_phrases(c, t, rng, keep_levels=0.8))
    contour = _pick(rng, t["contour"][c.contour])
    contour = f"，{contour}" if contour else ""
    emo = CONCLUSION_WORDS["zh"][c.emotion]
    end = _pick(rng, t["conclusion"]).format(e=emo)
    quote = _quote(c, "zh")
    if style == 0:
        return f"在音频中，一位{who}说话者{cues}{contour}，{t['interp'][c.emotion]}，{pron}说：{quote}。{end}"
    if style == 1:
        return f"在音频中，说话者{cues}{contour}。这位{who}说话者说道：{quote}，{t['interp'][c.emotion]}。{end}"
    return f"在音频中，一位{who}说话者说：{quote}，{cues}{contour}。{end}"


def write_references(cues: Cues, language: str, n: int, rng: np.random.Generator) -> list[str]:
    """`n` distinct-as-possible references in `language` ('en' or 'zh') for one clip."""
    writer = _english if language == "en" else _chinese
    styles = rng.permutation(3)
    refs: list[str] = []
    for i in range(n):
        refs.append(writer(cues, rng, int(styles[i % 3])))
    return refs
