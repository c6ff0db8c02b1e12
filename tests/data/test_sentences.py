from speccap.data.sentences import SENTENCES, sentence_index


def test_sentence_index_finds_the_corpus_sentences_and_nothing_else():
    assert [sentence_index(en) for en, _ in SENTENCES] == list(range(len(SENTENCES)))
    assert sentence_index("Something MER2024's subtitles say.") == -1
    assert sentence_index(None) == -1 and sentence_index("") == -1
