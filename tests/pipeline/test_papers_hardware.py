"""Time on the papers' hardware, counted in model steps."""

import pytest

from speccap.pipeline.papers_hardware import PAPER_CLOUD_OTPS, PAPER_EDGE_OTPS, papers_parts, papers_seconds


def test_papers_seconds_count_the_tokens_the_edge_fed():
    m = {"tokens": 9, "drafted": 10, "corrected": 2, "bonus": 1, "rounds": 3, "link_time": 0.3}
    old = (10 + 2 + 1) / PAPER_EDGE_OTPS + 3 / PAPER_CLOUD_OTPS + 0.3  # records without the count
    assert papers_seconds(m, "ugsd") == pytest.approx(old)
    # every draft fed but the end (9), the 2 corrections and the bonus: the same steps
    assert papers_seconds(m | {"edge_fed": 12}, "ugsd") == pytest.approx(old)
    # the two flagged drafts the cloud replaced were never fed: two edge steps fewer
    assert papers_seconds(m | {"edge_fed": 10}, "ugsd") == pytest.approx(old - 2 / PAPER_EDGE_OTPS)
    assert papers_seconds(m, "edge") == pytest.approx(10 / PAPER_EDGE_OTPS)


def test_the_time_ratio_splits_into_edge_cloud_and_link():
    m = {"tokens": 11, "edge_fed": 11, "rounds": 4, "link_time": 0.25}
    parts = papers_parts(m, "ugsd")
    assert parts == pytest.approx({"edge": 12 / PAPER_EDGE_OTPS, "cloud": 4 / PAPER_CLOUD_OTPS, "link": 0.25})
    assert sum(parts.values()) == pytest.approx(papers_seconds(m, "ugsd"))
    # a caption two tokens longer than edge-only's costs exactly two edge steps more
    edge = papers_parts({"tokens": 9}, "edge")
    assert parts["edge"] - edge["edge"] == pytest.approx(2 / PAPER_EDGE_OTPS) and edge["cloud"] == edge["link"] == 0
    cloud = papers_parts({"tokens": 9, "link_time": 0.1}, "cloud")
    assert cloud == pytest.approx({"edge": 0.0, "cloud": 10 / PAPER_CLOUD_OTPS, "link": 0.1})
