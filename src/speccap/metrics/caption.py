"""Caption quality: BLEU-1/4, METEOR and ROUGE-L F against one or more references, x100.

Tokens: English is lower-cased words; Chinese is one token per character (Latin words and
numbers inside Chinese text stay whole), for all four metrics. rouge-score's default tokenizer
keeps only [a-z0-9] and so scores every Chinese caption 0: we hand it our tokenizer instead.

BLEU: corpus-level (nltk corpus_bleu, no smoothing, the standard definition) and the mean of
sentence-level scores (nltk sentence_bleu with Chen & Cherry smoothing method 1, so that a short
caption missing all 4-grams scores small rather than exactly 0).
METEOR: nltk's meteor_score (WordNet synonyms for English; exact and stem matches for Chinese
characters), best over references, averaged over captions.
ROUGE-L: rouge-score's LCS F-measure, best over references (score_multi), averaged.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

from nltk.corpus import wordnet
from nltk.stem.porter import PorterStemmer
from nltk.translate.bleu_score import SmoothingFunction, closest_ref_length, corpus_bleu, modified_precision, sentence_bleu
from nltk.translate.meteor_score import meteor_score
from rouge_score import rouge_scorer

from ..data.emotions import detect_emotion

_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_EN_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_ZH_TOKEN = re.compile(rf"[{_CJK}]|[a-z0-9]+")
_CJK_CHAR = re.compile(rf"[{_CJK}]")
_LATIN_CHAR = re.compile(r"[A-Za-z]")


def tokenize(text: str, language: str) -> list[str]:
    text = text.lower()
    if language == "zh":
        return _ZH_TOKEN.findall(text)
    if language == "en":
        return _EN_TOKEN.findall(text)
    raise ValueError(f"unknown caption language {language!r} (expected 'en' or 'zh')")


class _RougeTokenizer:
    """The interface rouge-score expects of a custom tokenizer."""

    def __init__(self, language: str):
        self.language = language

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text, self.language)


def caption_language(text: str) -> str | None:
    """'zh' if CJK characters dominate the letters, 'en' if Latin letters do, None if neither."""
    cjk, latin = len(_CJK_CHAR.findall(text)), len(_LATIN_CHAR.findall(text))
    if cjk == 0 and latin == 0:
        return None
    # a Chinese character carries about as much as a 3-letter English word
    return "zh" if cjk * 3 >= latin else "en"


_PORTER = PorterStemmer()


class _KeptWords:
    """What METEOR asks of a word, its stem and its WordNet synsets, kept per process: it asks about
    the same words for every caption, and each answer is a function of the word alone."""

    stem = staticmethod(functools.cache(_PORTER.stem))
    synsets = staticmethod(functools.cache(wordnet.synsets))


_wordnet_checked = False


def _meteor(refs_tok: list[list[str]], hyp_tok: list[str]) -> float:
    global _wordnet_checked
    if not _wordnet_checked:
        try:
            wordnet.ensure_loaded()
        except LookupError as exc:
            raise LookupError(
                "METEOR needs NLTK's WordNet data and none was found. Run `bash scripts/setup.sh` "
                "(it installs Debian's wordnet files under ~/nltk_data), or with internet: "
                "python -m nltk.downloader wordnet") from exc
        _wordnet_checked = True
    if not hyp_tok:
        return 0.0
    return max(meteor_score([r], hyp_tok, stemmer=_KeptWords, wordnet=_KeptWords) for r in refs_tok)


@functools.cache
def _rouge(language: str) -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_RougeTokenizer(language))


# A stage scores the same clip's same caption again and again (every configuration whose caption
# came out alike; the ceiling's candidates), and METEOR's WordNet lookups dominate its scoring:
# each caption's scores are computed once per process. They are a function of the caption, its
# references and the language alone, so a kept one is the very number computed again.
@functools.lru_cache(maxsize=1 << 16)
def _caption_scores(hyp: str, refs: tuple[str, ...], language: str) -> dict:
    """One caption's scores against its non-empty references (a dict the caller copies)."""
    h_tok = tokenize(hyp, language)
    r_tok = [tokenize(r, language) for r in refs]
    smooth = SmoothingFunction().method1
    b1 = sentence_bleu(r_tok, h_tok, weights=(1, 0, 0, 0), smoothing_function=smooth) if h_tok else 0.0
    b4 = sentence_bleu(r_tok, h_tok, smoothing_function=smooth) if h_tok else 0.0
    rl = _rouge(language).score_multi(list(refs), hyp)["rougeL"].fmeasure if h_tok else 0.0
    lang = caption_language(hyp)
    # corpus BLEU-1's sufficient statistics (as nltk's corpus_bleu sums them), for the bootstrap
    p1 = modified_precision(r_tok, h_tok, 1)
    return {"bleu1": 100 * b1, "bleu4": 100 * b4, "meteor": 100 * _meteor(r_tok, h_tok), "rouge_l": 100 * rl,
            "bleu1_match": p1.numerator, "bleu1_count": p1.denominator, "hyp_len": len(h_tok),
            "ref_len": closest_ref_length(r_tok, len(h_tok)),
            "language": lang, "wrong_language": lang is not None and lang != language, "empty": not hyp.strip()}


@dataclass
class CaptionScores:
    n: int
    bleu1: float
    bleu4: float
    bleu1_sentence: float
    bleu4_sentence: float
    meteor: float
    rouge_l: float
    wrong_language_rate: float
    empty_rate: float
    emotion_hit_rate: float | None
    per_caption: list[dict]

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "per_caption"}


def score_captions(hypotheses: list[str], references: list[list[str]], language: str,
                   emotions: list[str | None] | None = None) -> CaptionScores:
    """Score captions against their references (several per clip allowed); all scores x100."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} captions but {len(references)} reference lists")
    if not hypotheses:
        raise ValueError("no captions to score")
    for i, refs in enumerate(references):
        if not refs or not any(r.strip() for r in refs):
            raise ValueError(f"caption {i}: no non-empty reference")
    # nltk warns on every caption without some n-gram overlap; the zero it returns is the answer
    warnings.filterwarnings("ignore", message=r"\s*The hypothesis contains 0 counts")
    hyps_tok = [tokenize(h, language) for h in hypotheses]
    refs_tok = [[tokenize(r, language) for r in refs if r.strip()] for refs in references]
    per = []
    for i, (hyp, refs) in enumerate(zip(hypotheses, references)):
        rec = dict(_caption_scores(hyp, tuple(r for r in refs if r.strip()), language))
        if emotions is not None and emotions[i] is not None:
            rec["emotion_pred"] = detect_emotion(hyp, language)
            rec["emotion_hit"] = rec["emotion_pred"] == emotions[i]
        per.append(rec)
    n = len(per)
    corpus1 = corpus_bleu(refs_tok, hyps_tok, weights=(1, 0, 0, 0))
    corpus4 = corpus_bleu(refs_tok, hyps_tok)
    hits = [r["emotion_hit"] for r in per if "emotion_hit" in r]
    mean = lambda key: sum(r[key] for r in per) / n  # noqa: E731
    return CaptionScores(
        n=n, bleu1=100 * corpus1, bleu4=100 * corpus4, bleu1_sentence=mean("bleu1"),
        bleu4_sentence=mean("bleu4"), meteor=mean("meteor"), rouge_l=mean("rouge_l"),
        wrong_language_rate=100 * sum(r["wrong_language"] for r in per) / n,
        empty_rate=100 * sum(r["empty"] for r in per) / n,
        emotion_hit_rate=(100 * sum(hits) / len(hits)) if hits else None, per_caption=per)
