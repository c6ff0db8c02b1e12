import json
import subprocess
import sys

from speccap.cli import main


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "speccap.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("prepare", "featurize", "score", "show"):
        assert cmd in out.stdout


def test_prepare_show_and_score(tmp_path, monkeypatch, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(
        "data:\n  raw_dir: %s\n  processed_dir: %s\n  synthetic: {train_per_language: 2, val_per_language: 1, "
        "test_per_language: 3, workers: 1}\n" % (tmp_path / "raw", tmp_path / "proc"))
    assert main(["--params", str(params), "prepare", "--quiet"]) == 0
    manifest = tmp_path / "proc" / "manifests" / "test.en.jsonl"
    assert main(["show", str(manifest), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "emotion=" in out and "In the audio" in out
    # score: the references themselves score perfectly
    recs = [json.loads(line) for line in manifest.open()]
    caps = tmp_path / "caps.jsonl"
    caps.write_text("".join(json.dumps({"id": r["id"], "caption": r["references"][0]}) + "\n" for r in recs))
    assert main(["score", str(manifest), str(caps)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["bleu4"] > 99 and scores["emotion_hit_rate"] == 100.0


def test_bad_params_exit_2_with_the_key(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("data:\n  sourse: synthetic\n")
    assert main(["--params", str(params), "prepare"]) == 2
    assert "data.sourse" in capsys.readouterr().err


def test_resolve_writes_a_file_per_stage(tmp_path, capsys):
    from speccap.cli import main
    assert main(["--params", "params.yaml", "resolve", "--out", str(tmp_path)]) == 0
    import yaml
    stages = set(yaml.safe_load(open("dvc.yaml"))["stages"]) - {"resolve"}  # every stage reads its own file
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(f"{s}.json" for s in stages)
    assert {"wisv_head", "wisv_eval", "gate_eval"} <= stages
    assert "decode.json" in capsys.readouterr().out


def test_caption_refuses_damaged_and_too_short_audio_and_says_when_it_trims(tiny_project, tmp_path, capsys):
    import numpy as np
    import soundfile as sf

    from speccap.models.language_mask import CJK
    _, _, pfile = tiny_project
    t = np.arange(16000 * 2) / 16000
    speech_like = (0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    nan = speech_like.copy()
    nan[500:520] = np.nan
    sf.write(tmp_path / "nan.wav", nan, 16000, subtype="FLOAT")
    sf.write(tmp_path / "blip.wav", speech_like[:800], 16000)
    sf.write(tmp_path / "long.wav", np.tile(speech_like, 300), 16000)  # ten minutes
    for name, problem in (("nan.wav", "20 of 32000 samples are NaN or infinite (a damaged float WAV?); nothing to caption from"),
                          ("blip.wav", "too short to caption: 0.050 s (the minimum is 0.5 s)")):
        assert main(["--params", str(pfile), "caption", str(tmp_path / name), "--mode", "ugsd"]) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == f"speccap caption: error: {tmp_path / name}: {problem}"
    # audio without speech in it: refused in one line that says what was found
    rng = np.random.default_rng(0)
    sf.write(tmp_path / "dc.wav", np.full(32000, 0.25, np.float32), 16000)
    sf.write(tmp_path / "noise.wav", (0.1 * rng.standard_normal(32000)).astype(np.float32), 16000)
    for name, found in (("dc.wav", "a constant offset of +0.250 with nothing on it above -60 dBFS"),
                        ("noise.wav", "a flat, noise-like spectrum (median spectral flatness 0.5")):
        for cmd in (["caption", "--mode", "ugsd"], ["caption", "--mode", "edge"]):
            assert main(["--params", str(pfile), *cmd[:1], str(tmp_path / name), *cmd[1:]]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith(
                f"speccap caption: error: {tmp_path / name}: no speech to caption: {found}"), err
    assert main(["--params", str(pfile), "caption", str(tmp_path / "long.wav"), "--mode", "ugsd", "--language", "en"]) == 0
    out = capsys.readouterr()
    assert f"{tmp_path / 'long.wav'}: note: trimmed from 600.0 s to its first 30.0 s" in out.err
    caption = out.out.split(": ", 1)[1].split("\n")[0]
    assert caption.strip() and not CJK.search(caption)


def test_calibrate_prints_a_cost_model_params_accept_and_the_clock_uses(tiny_project, tmp_path, capsys):
    import yaml

    from speccap.config import params_from_dict
    from speccap.decoding.build import DecodeSpec, build_decoder
    from speccap.decoding.cost import Work
    _, _, pfile = tiny_project
    assert main(["--params", str(pfile), "calibrate", "--clips", "1"]) == 0
    out = capsys.readouterr()
    block = yaml.safe_load(out.out)
    assert "timed calls on 2 test clips" in out.err  # one per language
    raw = yaml.safe_load(pfile.read_text())
    raw["decode"] = raw.get("decode", {}) | block["decode"]
    spec = DecodeSpec.from_params(params_from_dict(raw))
    cost = build_decoder(spec).cost
    assert cost.coef == block["decode"]["cost"] and cost.seconds(Work("cloud", 4, 100)) >= 0
    assert set(block["decode"]["cost"]) == {"edge", "cloud"}


def test_a_command_whose_role_is_not_installed_names_the_install(tmp_path, capsys, monkeypatch):
    """On a device (speccap[edge]) the pipeline's scoring libraries are missing: `speccap score` says
    which install it needs instead of a traceback."""
    import sys
    for name in [m for m in sys.modules if m == "nltk" or m.startswith("nltk.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nltk", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "speccap.metrics.caption", raising=False)
    (tmp_path / "m.jsonl").write_text("")
    (tmp_path / "c.jsonl").write_text("")
    assert main(["score", str(tmp_path / "m.jsonl"), str(tmp_path / "c.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "nltk" in err and "pip install 'speccap[pipeline]'" in err and "Traceback" not in err
