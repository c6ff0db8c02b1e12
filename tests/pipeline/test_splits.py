"""Which referenced clip is in which fold under cross-fitting, and when cross-fitting is on."""

import pytest

from speccap.config import ConfigError, params_from_dict
from speccap.data.manifest import ManifestError, manifest_path, write_jsonl
from speccap.pipeline.splits import active, folds_of, referenced_clips, shipped_split, val_fold

QWEN = {"backend": "qwen2_5_omni", "path": "/models/x"}


def test_folds_are_balanced_deterministic_and_independent_of_order():
    ids = [f"sample_{i:08d}" for i in range(332)]
    fold = folds_of(ids, 5)
    sizes = sorted(sum(f == k for f in fold.values()) for k in range(5))
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 332
    assert folds_of(list(reversed(ids)), 5) == fold
    assert [val_fold(f, 5) for f in range(5)] == [1, 2, 3, 4, 0]


def test_cross_fitting_is_the_default_on_mer2024_without_a_pool():
    mer = {"data": {"source": "mer2024"}, "models": {"edge": QWEN, "cloud": QWEN}}
    assert active(params_from_dict(mer))
    assert not active(params_from_dict(mer | {"data": {"source": "mer2024", "trace_pool": {"path": "/pool"}}}))
    assert not active(params_from_dict({"data": {"cross_fit": {"when": "never"}}} | {
        "data": {"source": "mer2024", "cross_fit": {"when": "never"}}, "models": {"edge": QWEN, "cloud": QWEN}}))
    assert not active(params_from_dict({}))  # the synthetic corpus has its own train and val clips
    assert active(params_from_dict({"data": {"cross_fit": {"when": "always"}}}))


def test_bad_cross_fit_params_are_named():
    with pytest.raises(ConfigError, match="data.cross_fit.folds"):
        params_from_dict({"data": {"cross_fit": {"folds": 2}}})
    with pytest.raises(ConfigError, match="data.cross_fit.when"):
        params_from_dict({"data": {"cross_fit": {"when": "sometimes"}}})


def _rec(i: int) -> dict:
    return {"id": f"c{i}", "path": f"c{i}.wav", "duration": 2.0, "split": "test", "language": "en",
            "references": ["x"]}


def test_shipped_split_and_too_few_clips(tmp_path):
    params = params_from_dict({"data": {"processed_dir": str(tmp_path), "languages": ["en"],
                                        "cross_fit": {"when": "always", "folds": 4}}})
    with pytest.raises(ManifestError, match="no test clips to cross-fit over"):
        referenced_clips(params, "en")
    write_jsonl(manifest_path(tmp_path, "test", "en"), [_rec(i) for i in range(3)])
    with pytest.raises(ManifestError, match="data.cross_fit.folds: 4 folds need at least 4"):
        referenced_clips(params, "en")
    write_jsonl(manifest_path(tmp_path, "test", "en"), [_rec(i) for i in range(10)])
    val, train = shipped_split(params, "val", "en"), shipped_split(params, "train", "en")
    assert {r["fold"] for r in val} == {0} and 0 not in {r["fold"] for r in train}
    assert sorted(r["id"] for r in val + train) == sorted(f"c{i}" for i in range(10))
