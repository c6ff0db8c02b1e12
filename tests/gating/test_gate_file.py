"""A gate file is the whole gate: read back alone it scores every row exactly as the trained gate
did, carries its thresholds and settings, and a file that is not one is refused by name."""

import json

import numpy as np
import pytest

from speccap.gating.gate_file import GateFileError, gate_document, model_of, read_gate, with_registry, write_gate
from speccap.gating.token_gates import TOKEN_KINDS, fit_token_gate

from .test_token_gates import DIM, EOS, _data

THRESHOLDS = {"0.05": {"en": 0.9, "zh": 0.8}, "0.1": {"en": 0.7, "zh": 0.6}}


def _doc(kind, target="critical"):
    x, labels = _data(1500, 0)
    if target == "gain":
        labels["impact"] = np.where(labels["critical"], 10.0, 0.0)
    model = fit_token_gate(x, labels, kind, target, DIM, EOS)
    return model, gate_document(model, f"tok-{kind}-{target}", THRESHOLDS, THRESHOLDS["0.1"], 0.1, "alone", {"en": 1})


@pytest.mark.parametrize("kind,target", [(k, "critical") for k in TOKEN_KINDS] + [("lightgbm", "gain")])
def test_a_gate_read_back_from_its_file_scores_exactly_as_trained(tmp_path, kind, target):
    model, doc = _doc(kind, target)
    path = write_gate(tmp_path / "g.gate.json", doc)
    back = read_gate(path)
    xv, _ = _data(500, 1)
    np.testing.assert_array_equal(model_of(back).token_scores(xv), model.token_scores(xv))
    assert back["thresholds"] == THRESHOLDS and back["threshold"] == THRESHOLDS["0.1"]
    assert back["verify"] == "alone" and back["verify_rank"] == {"en": 1} and back["name"] == f"tok-{kind}-{target}"
    # plain JSON a person (or another language) can read: the classifier in its own format
    assert json.loads(path.read_text())["classifier"]["format"] in ("lightgbm-model-text", "linear", "mlp-relu")


def test_the_registry_stamp_names_the_version():
    _, doc = _doc("logistic")
    stamped = with_registry(doc, "speccap-gate", 3, "champion")
    assert stamped["registry"] == {"name": "speccap-gate", "version": "3", "alias": "champion"}
    assert doc["registry"] is None  # the document itself is left as it was


def test_what_is_not_a_gate_file_is_refused_by_name(tmp_path):
    _, doc = _doc("logistic")
    with pytest.raises(GateFileError, match="missing.gate.json: no gate file there"):
        read_gate(tmp_path / "missing.gate.json")
    (tmp_path / "text.gate.json").write_text("not json")
    with pytest.raises(GateFileError, match="text.gate.json: not a gate file"):
        read_gate(tmp_path / "text.gate.json")
    cases = {"other": doc | {"format": "something-else"}, "newer": doc | {"format_version": 2},
             "columns": doc | {"features": doc["features"] | {"columns": ["entropy"]}},
             "classifier": doc | {"classifier": {"format": "svm"}}}
    for name, bad in cases.items():
        (tmp_path / f"{name}.gate.json").write_text(json.dumps(bad))
    with pytest.raises(GateFileError, match="other.gate.json: not a speccap-gate file"):
        read_gate(tmp_path / "other.gate.json")
    with pytest.raises(GateFileError, match="newer.gate.json: format version 2; this speccap reads version 1"):
        read_gate(tmp_path / "newer.gate.json")
    with pytest.raises(GateFileError, match="columns.gate.json: its feature columns"):
        read_gate(tmp_path / "columns.gate.json")
    with pytest.raises(GateFileError, match="classifier.gate.json: lacks 'svm'"):
        read_gate(tmp_path / "classifier.gate.json")
    # and a document that would not load is never written
    with pytest.raises(GateFileError):
        write_gate(tmp_path / "never.gate.json", cases["newer"])
    assert not (tmp_path / "never.gate.json").exists()
