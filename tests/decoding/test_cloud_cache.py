from speccap.config import LinkConfig
from speccap.decoding.engine import SpecSettings, speculative
from speccap.decoding.gates import make_gate
from speccap.decoding.link import Link
from speccap.decoding.policies import Fixed
from speccap.decoding.rules import make_rule


def test_persistent_cache_gives_the_same_caption_with_less_cloud_work(pair, audio):
    edge, cloud = pair
    runs = {}
    for cache in (True, False):
        s = SpecSettings(make_gate("always"), make_rule("greedy"), Fixed(3), max_new_tokens=20, cloud_cache=cache)
        runs[cache] = speculative(edge, cloud, audio[1], "en", s, Link(LinkConfig()))
    assert runs[True].token_ids == runs[False].token_ids
    assert runs[True].cloud_tokens < runs[False].cloud_tokens / 3
