"""The commands that caption files: which decoder and which learned gate they build from the
command line, and the gate's two sources (the registry's champion, a gate file) giving one gate."""

import json

import pytest

from speccap.caption_commands import _decode_spec, _learned_loader
from speccap.cli import build_parser, main
from speccap.config import params_from_dict
from speccap.decoding.build import build_decoder
from speccap.decoding.gates import make_gate
from speccap.gating.gate_file import gate_document, write_gate
from speccap.gating.token_gates import LearnedTokenGate, fit_token_gate

from .gating.test_token_gates import DIM, EOS, _data


def test_the_champion_judges_by_its_own_rank_unless_the_command_line_says_otherwise():
    gate = make_gate("entropy", 1.0).at_token_level("alone")
    gate.verify_rank = {"en": 1, "zh": 2}
    params = params_from_dict({"decode": {"rule": "rank", "rank": 3}})

    def rule(*argv):
        spec = _decode_spec(params, build_parser().parse_args(["caption", "x.wav", "--mode", "ugsd", *argv]))
        return build_decoder(spec, learned=lambda _spec: gate).rule
    assert rule("--gate", "champion").r == 1
    assert rule("--gate", "champion", "--language", "zh").r == 2
    assert rule("--gate", "champion", "--rank", "4").r == 4  # --rank wins
    assert rule("--gate", "champion", "--rule", "rank").r == 3  # so does --rule: the params' R
    assert rule("--gate", "entropy").r == 3  # a rule gate carries no R of its own



@pytest.fixture
def gate_file(tmp_path):
    x, labels = _data(1500, 0)
    model = fit_token_gate(x, labels, "logistic", "critical", DIM, EOS)
    thresholds = {"0.05": {"en": 0.9, "zh": 0.8}, "0.1": {"en": 0.6, "zh": 0.5}}
    doc = gate_document(model, "tok-logistic-critical", thresholds, thresholds["0.1"], 0.1, "alone", {"en": 1, "zh": 2})
    return write_gate(tmp_path / "champion.gate.json", doc)


def test_a_gate_file_is_a_learned_gate_at_its_own_thresholds_and_ranks(gate_file):
    params = params_from_dict({"decode": {"rule": "rank", "rank": 3}})
    args = build_parser().parse_args(["caption", "x.wav", "--mode", "ugsd", "--gate", str(gate_file), "--language", "zh"])
    spec = _decode_spec(params, args)
    decoder = build_decoder(spec, learned=_learned_loader(params, args.gate))
    gate = decoder.gate
    assert isinstance(gate, LearnedTokenGate) and gate.name == "tok-logistic-critical"
    assert gate.threshold_for("en") == 0.6 and gate.threshold_for("zh") == 0.5  # the promote budget's
    assert decoder.rule.r == 2  # the file's R for zh, as --gate champion judges
    again = _decode_spec(params, build_parser().parse_args(["caption", "x.wav", "--gate", str(gate_file),
                                                            "--threshold", "0.2"]))
    assert build_decoder(again, learned=_learned_loader(params, str(gate_file))).gate.threshold_for("en") == 0.2


def test_a_gate_that_is_neither_a_name_nor_a_file_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["caption", str(tmp_path / "x.wav"), "--gate", str(tmp_path / "nowhere.gate.json")])
    assert exc.value.code == 2
    assert "nowhere.gate.json' is neither a gate" in capsys.readouterr().err
    bad = tmp_path / "bad.gate.json"
    bad.write_text(json.dumps({"format": "something"}))
    loader = _learned_loader(params_from_dict({}), str(bad))
    with pytest.raises(ValueError, match="bad.gate.json: not a speccap-gate file"):
        loader(_decode_spec(params_from_dict({}), build_parser().parse_args(["caption", "x.wav", "--gate", str(bad)])))


def test_the_champion_without_mlflow_points_at_the_gate_file(tmp_path, monkeypatch):
    """An edge install has no MLflow: `--gate champion` says to pass the promoted gate's file."""
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)
    params = params_from_dict({"tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}"}})
    spec = _decode_spec(params, build_parser().parse_args(["caption", "x.wav", "--gate", "champion"]))
    with pytest.raises(LookupError, match="--gate models/champion.gate.json"):
        _learned_loader(params, "champion")(spec)
