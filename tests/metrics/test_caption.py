import random

import pytest
from nltk.corpus import wordnet as nltk_wordnet
from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu, sentence_bleu
from nltk.translate.meteor_score import meteor_score
from rouge_score import rouge_scorer

from speccap.metrics.caption import caption_language, score_captions, sentence_bleu1, tokenize, wordnet

HYP_EN = ["In the audio, the speaker's tone is raised with rapid pacing. Therefore, the speaker exhibits anger.",
          "In the audio, a soft voice and slow pacing. Therefore, the speaker exhibits sadness."]
REFS_EN = [["In the audio, the speaker's tone is raised with rapid pacing and a loud voice, expressing "
            "dissatisfaction. Therefore, the speaker exhibits anger.", "The voice is loud and fast: anger."],
           ["In the audio, the speaker talks slowly with a low, soft voice. Therefore, the speaker exhibits sadness."]]
HYP_ZH = ["在音频中，说话者语速很快，音量很大。因此，说话者表现出愤怒的情绪。", "在音频中，说话者语调低沉。因此，说话者感到悲伤。"]
REFS_ZH = [["在音频中，说话者语调上扬，语速很快，声音洪亮。因此，说话者表现出愤怒的情绪。"],
           ["在音频中，说话者语调低沉，语速缓慢。可以判断说话者感到悲伤。", "说话者声音颤抖，显得低落。"]]


def test_tokenizers():
    assert tokenize("The speaker's TONE, raised!", "en") == ["the", "speaker's", "tone", "raised"]
    assert tokenize("说话者用GPT4说：好😄", "zh") == ["说", "话", "者", "用", "gpt4", "说", "好"]
    with pytest.raises(ValueError, match="unknown caption language"):
        tokenize("x", "fr")


@pytest.mark.parametrize("hyps,refs,lang", [(HYP_EN, REFS_EN, "en"), (HYP_ZH, REFS_ZH, "zh")])
def test_scores_match_nltk_and_rouge_score_on_the_same_tokens(hyps, refs, lang):
    s = score_captions(hyps, refs, lang)
    h_tok = [tokenize(h, lang) for h in hyps]
    r_tok = [[tokenize(r, lang) for r in rs] for rs in refs]
    assert s.bleu1 == pytest.approx(100 * corpus_bleu(r_tok, h_tok, weights=(1, 0, 0, 0)))
    assert s.bleu4 == pytest.approx(100 * corpus_bleu(r_tok, h_tok))
    sm = SmoothingFunction().method1
    assert s.bleu4_sentence == pytest.approx(100 * sum(sentence_bleu(r, h, smoothing_function=sm)
                                                       for r, h in zip(r_tok, h_tok)) / 2)
    assert s.meteor == pytest.approx(100 * sum(max(meteor_score([x], h) for x in r)
                                               for r, h in zip(r_tok, h_tok)) / 2)

    class Tok:
        def tokenize(self, text):
            return tokenize(text, lang)

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=Tok())
    assert s.rouge_l == pytest.approx(100 * sum(scorer.score_multi(r, h)["rougeL"].fmeasure
                                                for r, h in zip(refs, hyps)) / 2)


def test_a_caption_scored_again_gets_the_same_numbers_and_its_own_copy():
    """Each caption's scores are kept per process (a stage scores the same caption for many
    configurations): scored again, alone or among others, it gets the same numbers, with METEOR
    nltk's own to the last bit, and what a caller changes in its copy is not kept."""
    first = score_captions(HYP_EN, REFS_EN, "en").per_caption
    for i, (hyp, refs) in enumerate(zip(HYP_EN, REFS_EN)):
        assert first[i]["meteor"] == 100 * max(meteor_score([tokenize(r, "en")], tokenize(hyp, "en")) for r in refs)
    first[0]["bleu1"] = -1.0
    again = score_captions(HYP_EN[::-1] + HYP_EN[:1], REFS_EN[::-1] + REFS_EN[:1], "en").per_caption
    assert again[1] == again[2] != first[0]
    assert again[2] == score_captions(HYP_EN[:1], REFS_EN[:1], "en").per_caption[0]
    assert again[2]["bleu1"] > 0 and again[0] == first[1]


@pytest.mark.parametrize("hyps,refs,lang", [
    (HYP_EN, REFS_EN, "en"), (HYP_ZH, REFS_ZH, "zh"),
    (["the voice is loud", "", "zzz qqq"], [["the voice is loud and fast"], ["a sad voice"], ["nothing alike"]], "en"),
    (["no match here"], [["entirely other words"]], "en"),  # no unigram matches: 0
    (["a b c"], [["a b c d e f"]], "en"),  # no 4-gram in the hypothesis: an order with nothing to match
])
def test_corpus_bleu_is_nltk_wordnet_to_the_last_bit(hyps, refs, lang):
    """Corpus BLEU from each caption's kept n-gram statistics equals nltk's `corpus_bleu` exactly."""
    s = score_captions(hyps, refs, lang)
    h_tok = [tokenize(h, lang) for h in hyps]
    r_tok = [[tokenize(r, lang) for r in rs] for rs in refs]
    assert s.bleu1 == 100 * corpus_bleu(r_tok, h_tok, weights=(1, 0, 0, 0))
    assert s.bleu4 == 100 * corpus_bleu(r_tok, h_tok)


def test_hand_computed_values():
    # hyp "a b c d", ref "a b x d e": unigram precision 3/4, BP = exp(1 - 5/4); LCS = 3 -> P 3/4, R 3/5
    s = score_captions(["a b c d"], [["a b x d e"]], "en")
    import math
    assert s.bleu1 == pytest.approx(100 * 0.75 * math.exp(1 - 5 / 4))
    assert s.rouge_l == pytest.approx(100 * 2 * 0.75 * 0.6 / (0.75 + 0.6))


def test_chinese_scores_are_nonzero_and_sensible():
    same = score_captions(REFS_ZH[0], [REFS_ZH[0]], "zh")
    assert same.bleu4 == pytest.approx(100) and same.rouge_l == pytest.approx(100) and same.meteor > 99
    good = score_captions(HYP_ZH, REFS_ZH, "zh")
    bad = score_captions(["今天天气很好，我们去公园散步吧。", "这道菜太咸了。"], REFS_ZH, "zh")
    for key in ("bleu1", "bleu4", "meteor", "rouge_l"):
        assert getattr(good, key) > getattr(bad, key) and getattr(good, key) > 0
    # the trap this module avoids: rouge-score's own tokenizer scores Chinese 0
    default = rouge_scorer.RougeScorer(["rougeL"]).score(REFS_ZH[0][0], HYP_ZH[0])["rougeL"].fmeasure
    assert default == 0.0 and good.rouge_l > 40


def test_multiple_references_take_the_best():
    one = score_captions([HYP_EN[0]], [REFS_EN[0][1:]], "en")
    both = score_captions([HYP_EN[0]], [REFS_EN[0]], "en")
    assert both.rouge_l > one.rouge_l and both.meteor > one.meteor


def test_wrong_language_empty_and_emotion_hit():
    hyps = ["在音频中，说话者很生气。因此表现出愤怒。", "In the audio, the speaker exhibits anger.", "", "calm, neutral voice"]
    refs = [["In the audio, anger."]] * 4
    s = score_captions(hyps, refs, "en", emotions=["angry", "angry", "angry", "sad"])
    assert s.wrong_language_rate == 25.0 and s.empty_rate == 25.0
    assert s.emotion_hit_rate == 25.0  # only the English caption names anger in English
    assert caption_language("Hello 你好") == "zh" and caption_language("Hello there, 你") == "en"
    assert caption_language("123 !!") is None


def test_bad_input():
    with pytest.raises(ValueError, match="2 captions but 1 reference"):
        score_captions(["a", "b"], [["a"]], "en")
    with pytest.raises(ValueError, match="caption 0: no non-empty reference"):
        score_captions(["a"], [[" "]], "en")
    with pytest.raises(ValueError, match="no captions"):
        score_captions([], [], "en")
    s = score_captions(["In the audio 😄 naïve café"], [["In the audio — “naïve” café 😄"]], "en")
    assert s.bleu1 > 0


def _random_cases(lang: str, n: int, seed: int):
    """Captions and reference sets over a few words (or characters), so that n-grams repeat, LCS
    ties and references without a token (punctuation alone) come up."""
    rng = random.Random(seed)
    words = ["the", "voice", "is", "loud", "calm", "anger", "sad", "a", "speaker"] if lang == "en" else list("说话者声音很大愤怒悲伤")
    join = " ".join if lang == "en" else "".join
    for _ in range(n):
        hyp = join(rng.choices(words, k=rng.randint(1, 14)))
        refs = [join(rng.choices(words, k=rng.randint(1, 14))) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.15:
            refs.insert(rng.randrange(len(refs) + 1), "!?")
        yield hyp, refs


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_sentence_bleu_and_rouge_l_are_the_libraries_to_the_last_bit_and_type(lang):
    """Sentence BLEU-1/4 (smoothing method 1) and ROUGE-L are computed here, not by nltk and
    rouge-score: every caption's numbers are theirs exactly, down to rouge-score's integer 0 for a
    reference without tokens, and to nltk's 0 without a unigram match."""
    sm = SmoothingFunction().method1

    class Tok:
        def tokenize(self, text):
            return tokenize(text, lang)

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=Tok())
    for hyp, refs in _random_cases(lang, 400, seed=1):
        got = score_captions([hyp], [refs], lang).per_caption[0]
        h = tokenize(hyp, lang)
        r = [tokenize(x, lang) for x in refs]
        bleu1 = sentence_bleu(r, h, weights=(1, 0, 0, 0), smoothing_function=sm)
        want = {"bleu1": 100 * bleu1,
                "bleu4": 100 * sentence_bleu(r, h, smoothing_function=sm),
                "rouge_l": 100 * scorer.score_multi(refs, hyp)["rougeL"].fmeasure}
        assert repr({k: got[k] for k in want}) == repr(want), (hyp, refs)
        assert repr(sentence_bleu1(refs, h, lang)) == repr(bleu1)
    # no word in common: nltk's integer 0, and rouge-score's 0.0
    none = score_captions(["calm"], [["loud anger"]], "en").per_caption[0]
    assert repr((none["bleu1"], none["rouge_l"])) == "(0, 0.0)"


def test_meteor_reads_wordnet_without_the_multilingual_map_and_finds_nltk_wordnet_own_synsets():
    words = tokenize(" ".join(h for refs in REFS_EN for h in refs), "en") + ["glad", "furious", "unhappy"]
    assert all(wordnet.synsets(w) == nltk_wordnet.synsets(w) for w in words)
    assert wordnet.map30 is None and nltk_wordnet.map30  # the map nltk builds for OMW data, left unbuilt here
