"""Caption quality: BLEU-1/4, METEOR and ROUGE-L F against one or more references, x100.

Tokens: English is lower-cased words; Chinese is one token per character (Latin words and
numbers inside Chinese text stay whole), for all four metrics (rouge-score's own tokenizer keeps
only [a-z0-9] and would score every Chinese caption 0).

BLEU: corpus-level (nltk's corpus_bleu, no smoothing, the standard definition; summed from each
caption's kept n-gram statistics, `corpus_bleu` here) and the mean of
sentence-level scores (nltk sentence_bleu with Chen & Cherry smoothing method 1, so that a short
caption missing all 4-grams scores small rather than exactly 0).
METEOR: nltk's meteor_score (WordNet synonyms for English; exact and stem matches for Chinese
characters), best over references, averaged over captions.
ROUGE-L: rouge-score's LCS F-measure, best over references (score_multi), averaged.

Sentence BLEU and ROUGE-L are computed here rather than by nltk and rouge-score, to their last
bit (tests/metrics/test_caption.py holds them to the libraries): a stage scores thousands of
captions of the same few hundred clips between its decoding runs, and the libraries count each
reference's n-grams again for every caption and fill the LCS table cell by cell in Python.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass

from nltk.corpus.reader import CorpusReader, WordNetCorpusReader
from nltk.corpus.util import LazyCorpusLoader
from nltk.stem.porter import PorterStemmer
from nltk.translate.bleu_score import brevity_penalty, closest_ref_length
from nltk.translate.meteor_score import meteor_score

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


def caption_language(text: str) -> str | None:
    """'zh' if CJK characters dominate the letters, 'en' if Latin letters do, None if neither."""
    cjk, latin = len(_CJK_CHAR.findall(text)), len(_LATIN_CHAR.findall(text))
    if cjk == 0 and latin == 0:
        return None
    # a Chinese character carries about as much as a 3-letter English word
    return "zh" if cjk * 3 >= latin else "en"


_PORTER = PorterStemmer()


class _EnglishWordNet(WordNetCorpusReader):
    """nltk's WordNet reader without the map it builds as it loads, from WordNet 3.0's synsets to the
    loaded version's, for its multilingual (OMW) data: METEOR reads English synsets alone, and the
    map took half of the load (1.6 of 3.1 s in each process that scores captions)."""

    def map_wn(self, version: str = "wordnet") -> None:
        return None


# as nltk.corpus.wordnet is declared, but for the reader
wordnet = LazyCorpusLoader("wordnet", _EnglishWordNet,
                           LazyCorpusLoader("omw-2.0", CorpusReader, r".*/wn-data-.*\.tab", encoding="utf8"))


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


class References:
    """One clip's references, tokenized, and for n = 1..4 each n-gram's largest count in any of
    them: what every caption of the clip is clipped against (a stage scores many captions of it)."""

    def __init__(self, refs: tuple[str, ...], language: str):
        self.tokens = tuple(tokenize(r, language) for r in refs)
        self.most: list[dict[tuple[str, ...], int]] = []
        for n in range(1, 5):
            most: dict[tuple[str, ...], int] = {}
            for tok in self.tokens:
                for gram, count in Counter(_ngrams(tok, n)).items():
                    if count > most.get(gram, 0):
                        most[gram] = count
            self.most.append(most)

    def clipped(self, hyp: list[str], n: int) -> tuple[int, int]:
        """nltk's `modified_precision` of order n as (numerator, denominator), unreduced as nltk
        leaves them: the hypothesis's n-grams clipped to their largest count in one reference."""
        counts = Counter(_ngrams(hyp, n))
        most = self.most[n - 1]
        return sum(min(c, most.get(gram, 0)) for gram, c in counts.items()), max(1, sum(counts.values()))


def _ngrams(tokens: list[str], n: int):
    return zip(*(tokens[i:] for i in range(n)))


@functools.lru_cache(maxsize=1 << 12)
def references_of(refs: tuple[str, ...], language: str) -> References:
    """A clip's references (non-empty texts) made ready for `overlaps`, kept per process."""
    return References(refs, language)


def _sentence_bleu(grams: tuple[tuple[int, int], ...], hyp_len: int, ref_len: int,
                   weights: tuple[float, ...]) -> float:
    """nltk's `sentence_bleu` with smoothing method 1 (an order without a match counts 0.1 of one),
    to the last bit, from the caption's clipped n-gram statistics; 0 without a unigram match."""
    if grams[0][0] == 0:
        return 0
    precisions = [m / c if m else (m + 0.1) / c for m, c in grams]
    return brevity_penalty(ref_len, hyp_len) * math.exp(math.fsum(w * math.log(p) for w, p in zip(weights, precisions)))


def _lcs_length(a: list[str], b: list[str]) -> int:
    """The longest common subsequence's length, a bit per token of `a` (Hyyro's bit-parallel
    form of the dynamic programme rouge-score fills cell by cell: the same number)."""
    where: dict[str, int] = {}
    for i, tok in enumerate(a):
        where[tok] = where.get(tok, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for tok in b:
        u = v & where.get(tok, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - v.bit_count()


def _rouge_l(refs_tok: tuple[list[str], ...], hyp: list[str]) -> float:
    """rouge-score's ROUGE-L F-measure, best over the references (`score_multi`), to the last bit
    and type: its integer 0 for a reference without tokens, its first best on a tie."""
    best = None
    for ref in refs_tok:
        if not ref or not hyp:
            f = 0
        else:
            lcs = _lcs_length(ref, hyp)
            precision, recall = lcs / len(hyp), lcs / len(ref)
            f = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        if best is None or f > best:
            best = f
    return best


def overlaps(hyp: list[str], ref: References) -> tuple[float, float, float, tuple[tuple[int, int], ...], int]:
    """A tokenized caption's sentence BLEU-1 and BLEU-4 (x1, smoothing method 1), ROUGE-L F (x1),
    clipped n-gram statistics (n = 1..4) and closest reference length."""
    grams = tuple(ref.clipped(hyp, n) for n in range(1, 5))
    ref_len = closest_ref_length(ref.tokens, len(hyp))
    b1 = _sentence_bleu(grams, len(hyp), ref_len, (1, 0, 0, 0)) if hyp else 0.0
    b4 = _sentence_bleu(grams, len(hyp), ref_len, (0.25, 0.25, 0.25, 0.25)) if hyp else 0.0
    return b1, b4, _rouge_l(ref.tokens, hyp) if hyp else 0.0, grams, ref_len


# A stage scores the same clip's same caption again and again (every configuration whose caption
# came out alike; the ceiling's candidates), and METEOR's WordNet lookups dominate its scoring:
# each caption's scores are computed once per process. They are a function of the caption, its
# references and the language alone, so a kept one is the very number computed again.
@functools.lru_cache(maxsize=1 << 16)
def _caption_scores(hyp: str, refs: tuple[str, ...], language: str) -> tuple[dict, tuple[tuple[int, int], ...]]:
    """One caption's scores against its non-empty references (a dict the caller copies), and its
    clipped n-gram matches and n-gram counts for n = 1..4, what corpus BLEU sums over captions."""
    h_tok = tokenize(hyp, language)
    ref = references_of(refs, language)
    b1, b4, rl, grams, ref_len = overlaps(h_tok, ref)
    lang = caption_language(hyp)
    # corpus BLEU-1's sufficient statistics, for the bootstrap
    return {"bleu1": 100 * b1, "bleu4": 100 * b4, "meteor": 100 * _meteor(ref.tokens, h_tok), "rouge_l": 100 * rl,
            "bleu1_match": grams[0][0], "bleu1_count": grams[0][1], "hyp_len": len(h_tok), "ref_len": ref_len,
            "language": lang, "wrong_language": lang is not None and lang != language,
            "empty": not hyp.strip()}, grams


def sentence_bleu1(references: list[str], hyp: list[str], language: str) -> float:
    """A tokenized caption's sentence BLEU-1 (x1, smoothing method 1, as in the scores above)
    against references given as text (those without text left out)."""
    return overlaps(hyp, references_of(tuple(r for r in references if r.strip()), language))[0]


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
