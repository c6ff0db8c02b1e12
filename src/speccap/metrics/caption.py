"""Caption quality: BLEU-1/4, METEOR and ROUGE-L F against one or more references, x100.

Tokens: English is lower-cased words; Chinese is one token per character (Latin words and
numbers inside Chinese text stay whole), for all four metrics. rouge-score's default tokenizer
keeps only [a-z0-9] and so scores every Chinese caption 0: we hand it our tokenizer instead.

BLEU: corpus-level (nltk's corpus_bleu, no smoothing, the standard definition; summed from each
caption's kept n-gram statistics, `corpus_bleu` here) and the mean of
sentence-level scores (nltk sentence_bleu with Chen & Cherry smoothing method 1, so that a short
caption missing all 4-grams scores small rather than exactly 0).
METEOR: nltk's meteor_score (WordNet synonyms for English; exact and stem matches for Chinese
characters), best over references, averaged over captions.
ROUGE-L: rouge-score's LCS F-measure, best over references (score_multi), averaged.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import warnings
from dataclasses import dataclass

from nltk.corpus import wordnet
from nltk.stem.porter import PorterStemmer
from nltk.translate.bleu_score import SmoothingFunction, brevity_penalty, closest_ref_length, modified_precision, sentence_bleu
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


@functools.cache
def _synsets(word: str) -> list:
    # `wordnet` loads its files at the first attribute read: here, not when the module is imported
    return wordnet.synsets(word)


class _KeptWords:
    """What METEOR asks of a word, its stem and its WordNet synsets, kept per process: it asks about
    the same words for every caption, and each answer is a function of the word alone."""

    stem = staticmethod(functools.cache(_PORTER.stem))
    synsets = staticmethod(_synsets)


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
def _caption_scores(hyp: str, refs: tuple[str, ...], language: str) -> tuple[dict, tuple[tuple[int, int], ...]]:
    """One caption's scores against its non-empty references (a dict the caller copies), and its
    clipped n-gram matches and n-gram counts for n = 1..4, what corpus BLEU sums over captions."""
    h_tok = tokenize(hyp, language)
    r_tok = [tokenize(r, language) for r in refs]
    smooth = SmoothingFunction().method1
    b1 = sentence_bleu(r_tok, h_tok, weights=(1, 0, 0, 0), smoothing_function=smooth) if h_tok else 0.0
    b4 = sentence_bleu(r_tok, h_tok, smoothing_function=smooth) if h_tok else 0.0
    rl = _rouge(language).score_multi(list(refs), hyp)["rougeL"].fmeasure if h_tok else 0.0
    lang = caption_language(hyp)
    grams = tuple((p.numerator, p.denominator) for p in (modified_precision(r_tok, h_tok, n) for n in range(1, 5)))
    # corpus BLEU-1's sufficient statistics, for the bootstrap
    return {"bleu1": 100 * b1, "bleu4": 100 * b4, "meteor": 100 * _meteor(r_tok, h_tok), "rouge_l": 100 * rl,
            "bleu1_match": grams[0][0], "bleu1_count": grams[0][1], "hyp_len": len(h_tok),
            "ref_len": closest_ref_length(r_tok, len(h_tok)),
            "language": lang, "wrong_language": lang is not None and lang != language,
            "empty": not hyp.strip()}, grams


def corpus_bleu(grams: list[tuple[tuple[int, int], ...]], hyp_len: int, ref_len: int,
                weights: tuple[float, ...]) -> float:
    """Corpus BLEU (no smoothing) from each caption's clipped n-gram matches and counts (n = 1..4)
    and the corpus's hypothesis and closest-reference lengths: nltk's `corpus_bleu` to the last
    bit (tests/metrics/test_caption.py), without computing every caption's n-grams again. As
    there, no unigram match scores 0, and an order with no match a precision of the smallest
    float, so the geometric mean is 0."""
    matches = [sum(g[n][0] for g in grams) for n in range(4)]
    counts = [sum(g[n][1] for g in grams) for n in range(4)]
    if matches[0] == 0:
        return 0
    precisions = [m / c if m else sys.float_info.min for m, c in zip(matches, counts)]
    return brevity_penalty(ref_len, hyp_len) * math.exp(math.fsum(w * math.log(p) for w, p in zip(weights, precisions)))


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
    per, grams = [], []
    for i, (hyp, refs) in enumerate(zip(hypotheses, references)):
        kept, caption_grams = _caption_scores(hyp, tuple(r for r in refs if r.strip()), language)
        rec = dict(kept)
        if emotions is not None and emotions[i] is not None:
            rec["emotion_pred"] = detect_emotion(hyp, language)
            rec["emotion_hit"] = rec["emotion_pred"] == emotions[i]
        per.append(rec)
        grams.append(caption_grams)
    n = len(per)
    hyp_len, ref_len = sum(r["hyp_len"] for r in per), sum(r["ref_len"] for r in per)
    corpus1 = corpus_bleu(grams, hyp_len, ref_len, (1, 0, 0, 0))
    corpus4 = corpus_bleu(grams, hyp_len, ref_len, (0.25, 0.25, 0.25, 0.25))
    hits = [r["emotion_hit"] for r in per if "emotion_hit" in r]
    mean = lambda key: sum(r[key] for r in per) / n  # noqa: E731
    return CaptionScores(
        n=n, bleu1=100 * corpus1, bleu4=100 * corpus4, bleu1_sentence=mean("bleu1"),
        bleu4_sentence=mean("bleu4"), meteor=mean("meteor"), rouge_l=mean("rouge_l"),
        wrong_language_rate=100 * sum(r["wrong_language"] for r in per) / n,
        empty_rate=100 * sum(r["empty"] for r in per) / n,
        emotion_hit_rate=(100 * sum(hits) / len(hits)) if hits else None, per_caption=per)
