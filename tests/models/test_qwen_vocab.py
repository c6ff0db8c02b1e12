from speccap.models.qwen_vocab import QWEN_OMNI_SPECIAL, qwen_tokenizer_offline


def test_real_qwen_vocabulary_offline():
    tok = qwen_tokenizer_offline()
    assert len(tok) == 151657
    text = "<|im_start|>user\nIn the audio, 说话者很生气。<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == QWEN_OMNI_SPECIAL["<|im_start|>"] and ids[-1] == QWEN_OMNI_SPECIAL["<|im_end|>"]
    assert ids[1] == 872  # "user": the id Qwen's configs name as user_token_id
    assert tok.decode(ids) == text
