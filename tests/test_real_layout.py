"""The users' path end to end, as a new user takes it: real checkpoints (tiny random-weight thinkers of
the real Qwen-Omni classes with Qwen's real vocabulary), a folder in MER2024's official layout with real
speech, params switched as docs/hpc.md section 2 says (on the CI profile), then `dvc repro` of every
stage in a copy of this repository, a promoted champion, and `speccap caption --gate champion` with it.
Both ways the gates can learn on MER2024 run: a folder of unlabeled speech as the trace pool
(Qwen2.5-Omni), and no pool at all, so the gates are cross-fitted over the referenced clips
(Qwen3-Omni-MoE)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from speccap.data.audio_io import write_wav
from speccap.data.tts import Prosody, Speaker
from speccap.models.configs import SpecialIds, build_model
from speccap.models.qwen_vocab import qwen_tokenizer_offline
from speccap.params_reads import recorded
from speccap.stage_params import STAGE_PARAMS, uncovered

from .models.conftest import TINY

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
QWEN_IDS = SpecialIds(audio=151646, audio_start=151647, audio_end=151648, image=151655, video=151656,
                      vision_start=151652, vision_end=151653, pad=151643, eos=151645)
LINES = ["I cannot believe you did that again.", "The weather is lovely this morning.",
         "Please leave me alone for a while.", "We finally won the match yesterday.",
         "Nobody told me about the meeting.", "This is the best day of my life.",
         "I am so tired of waiting here.", "Could you open the window please."]


def _speech(speaker: Speaker, k: int) -> np.ndarray:
    """Real speech at 16 kHz mono, as the organisers' ffmpeg step leaves MER2024's audio."""
    import soxr
    voice = ("en+f3", "en+m1", "en+m3", "en+f2")[k % 4]
    x = speaker.say(LINES[k % len(LINES)], voice, Prosody(pitch=30 + 8 * k % 60, rate=150 + 10 * k), seed=k)
    return soxr.resample(x, speaker.sample_rate, 16000).astype(np.float32)


def _project(tmp: Path) -> Path:
    """A copy of this repository's tracked files, as a fresh clone has them."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    proj = tmp / "proj"
    for f in files:
        if (ROOT / f).is_file() and not f.startswith("reports/"):
            (proj / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, proj / f)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=ci@example.org", "-c", "user.name=ci", "commit", "-qm", "clone"]):
        subprocess.run(cmd, cwd=proj, check=True)
    return proj


def _checkpoint(path: Path, family: str, noise: float = 0.0) -> None:
    """A tiny thinker of the real class with random weights. Two independent random models never agree on
    a token among 151,936, so the cloud is the edge with noise on its output layer: they agree on about
    half the tokens, as a 3B and a 7B model of one family would more often than not."""
    model = build_model(family, 151936, TINY, QWEN_IDS, seed=1)
    if noise:
        w = model.lm_head.weight
        with torch.no_grad():
            w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(7)) * w.std() * noise)
    model.save_pretrained(str(path))
    qwen_tokenizer_offline().save_pretrained(str(path))


def _references_from_the_cloud(proj: Path, env: dict, mer: Path, names: list[str]) -> None:
    """Rewrite the caption table with each clip's cloud-only captions as its references (kept whole:
    reference_mode full). Random-weight models caption in random tokens, so against written references
    no correction ever helps and the gates would have no positive example to learn from; against the
    cloud's own words the corrections that bring a caption closer to it do."""
    refs = {}
    for lang in ("en", "zh"):
        run = subprocess.run([sys.executable, "-m", "speccap.cli", "caption", *(str(mer / f"{n}.wav") for n in names),
                              "--mode", "cloud", "--language", lang, "--json"], cwd=proj, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        refs[lang] = [json.loads(line)["caption"] for line in run.stdout.strip().splitlines()]
    assert all(c.strip() for c in refs["en"] + refs["zh"]), refs
    pd.DataFrame({"name": names, "chinese": refs["zh"], "english": refs["en"]}).to_csv(
        mer / "final-EMER-reason.csv", index=False)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["data"]["mer2024"]["reference_mode"] = "full"
    (proj / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))


# (family, referenced clips, unlabeled pool clips): with a pool the gates learn from it; without one they
# are cross-fitted over the referenced clips (3 folds of 4: each fold's gates train on one, threshold on another)
CASES = {"pool": ("qwen2_5_omni", 4, 8), "cross-fit": ("qwen3_omni_moe", 12, 0)}
# both cases run at once, each slower than alone
REPRO_TIMEOUT_S = 2700


@dataclass
class Started:
    """A case's project, running `dvc repro` in its own process group (its Prefect server included)."""
    proj: Path
    env: dict
    mer: Path
    names: list[str]
    reads: Path
    log: Path
    proc: subprocess.Popen


def _start(tmp: Path, case: str) -> Started:
    """Lay out a case's checkpoints, MER2024 folder and params, and start its `dvc repro`."""
    family, n_ref, n_pool = CASES[case]
    proj = _project(tmp)
    _checkpoint(tmp / "edge", family)
    _checkpoint(tmp / "cloud", family, noise=0.2)
    speaker = Speaker()
    mer = tmp / "MER2024"
    mer.mkdir()
    names = [f"sample_{k:08d}" for k in range(n_ref)]
    rows = [{"name": n, "chinese": "在视频中，他皱着眉；在音频中，语气急促，音量较高。因此，他感到愤怒。",
             "english": "In the video, he frowns. In the audio, the tone is hurried and loud. "
                        "Therefore, he is angry."} for n in names]
    pd.DataFrame(rows).to_csv(mer / "final-EMER-reason.csv", index=False)
    for k, n in enumerate(names):
        write_wav(mer / f"{n}.wav", _speech(speaker, k))

    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["profile"] = "ci"
    params["data"]["source"] = "mer2024"
    params["data"]["mer2024"]["path"] = str(mer)
    if n_pool:
        pool = tmp / "unlabeled"
        pool.mkdir()
        for k in range(n_ref, n_ref + n_pool):
            write_wav(pool / f"clip_{k:03d}.wav", _speech(speaker, k))
        params["data"]["trace_pool"] = {"path": str(pool), "val_share": 0.3}
    else:  # data.source: mer2024 alone; cross_fit.when stays auto; every referenced clip evaluated
        params["data"]["cross_fit"]["folds"] = 3
        # one budget: on 12 clips of random-weight models two budgets can give a gate the same threshold,
        # and gate_configs keeps one budget's tag for the one configuration they share
        params["profiles"]["ci"]["gates"] |= {"eval_clips": 0, "detail_clips": 0, "budgets": [0.25]}
    params["models"]["max_new_tokens"] = 6
    # the users' path through every stage, not through every decoder: one L and one gate threshold in the
    # decode sweep, no pipelined or Q-S rows, no first-k oracles (the CI's own repro runs those)
    ci = params["profiles"]["ci"]
    ci["sweep"] = ci["sweep"] | {"block_lens": [0], "gates": {"entropy": [2.0]}, "in_flight": [], "qs_levels": []}
    ci["gates"] = ci["gates"] | {"oracle_corrections": []}
    params["models"]["edge"] |= {"backend": family, "path": str(tmp / "edge")}
    params["models"]["cloud"] |= {"backend": family, "path": str(tmp / "cloud")}
    (proj / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    env |= {"PYTHONPATH": str(proj / "src"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    if not n_pool:  # the human references are what the cloud says, as a strong cloud would come close to
        _references_from_the_cloud(proj, env, mer, names)
    reads = tmp / "reads"  # every params key a stage reads on this path (speccap.params_reads)
    log = tmp / "repro.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "scripts/with_prefect.sh", "dvc", "repro"], cwd=proj,
                                env=env | {"SPECCAP_RECORD_PARAMS": str(reads)}, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return Started(proj, env, mer, names, reads, log, proc)


def _stop(started: Started) -> None:
    """Stop a repro still running, with the Prefect server its script started (the whole group)."""
    if started.proc.poll() is None:
        os.killpg(started.proc.pid, signal.SIGKILL)
        started.proc.wait()


@pytest.fixture(scope="module")
def repros(request, tmp_path_factory):
    """Every selected case's `dvc repro`, started at once: a repro keeps about one of two cores busy
    (each stage's start-up is single-threaded), so the cases overlap instead of queueing. The second
    case's set-up runs while the first case's repro does."""
    selected = {item.callspec.params["case"] for item in request.session.items
                if item.module.__name__ == __name__ and hasattr(item, "callspec")}
    started: dict[str, Started] = {}
    try:
        for case in (c for c in CASES if c in selected):
            started[case] = _start(tmp_path_factory.mktemp(case), case)
        yield started
    finally:
        for s in started.values():
            _stop(s)


@pytest.mark.parametrize("case", list(CASES))
def test_real_checkpoints_and_mer2024_run_every_stage_and_ship_a_champion(repros, case):
    _, n_ref, n_pool = CASES[case]
    s = repros[case]
    proj, env, mer, names, reads = s.proj, s.env, s.mer, s.names, s.reads
    try:
        returncode = s.proc.wait(timeout=REPRO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop(s)
        pytest.fail(f"dvc repro of the {case} case ran past {REPRO_TIMEOUT_S} s:\n{s.log.read_text()[-6000:]}")
    log = s.log.read_text()
    assert returncode == 0, log[-6000:]
    assert "Traceback" not in log, log[-6000:]
    # ... is one its resolved params make it depend on: a change of any would re-run it
    assert set(STAGE_PARAMS) <= set(recorded(reads)), sorted(recorded(reads))
    missing = uncovered(recorded(reads))
    assert missing == [], "\n".join(missing)

    prep = json.loads((proj / "data/processed/prepare_report.json").read_text())
    assert prep["clips"] == n_ref and prep["pool_clips"] == n_pool, prep
    assert not (proj / "data/raw/mer2024/wav").exists()  # 16 kHz mono: every clip used in place
    refs = json.loads((proj / "reports/trace_refs.json").read_text())
    if n_pool:  # the pool's clips are judged against the cloud-only caption
        assert refs["cross_fit_folds"] is None, refs
        assert all(s["cloud_referenced"] + s["empty_cloud_captions"] > 0 for s in refs["splits"].values()), refs
    else:  # the referenced clips train the gates, with their human references
        assert refs["cross_fit_folds"] == 3, refs
        assert all(s["clips"] > 0 and s["cloud_referenced"] == 0 for s in refs["splits"].values()), refs
    train = json.loads((proj / "models/train_report.json").read_text())
    assert train["edge"]["trained"] is False and train["cloud"]["trained"] is False
    gates = json.loads((proj / "reports/gates/gates.json").read_text())
    assert set(gates["languages"]) == {"en", "zh"}
    # the gate evaluation captions every referenced clip (scored against the human references)
    summary = json.loads((proj / "reports/gates/summary.json").read_text())
    assert summary["configs"] and all(c["status"] == "FINISHED" for c in summary["configs"]), summary["configs"]
    if n_pool:
        runs = list((proj / "reports/gate_runs").glob("*.jsonl"))
        assert runs and all(len(f.read_text().splitlines()) == n_ref for f in runs)
    else:  # each row pools the folds, every clip decoded by the gates of its own fold, which never saw it
        pooled = [c for c in summary["configs"] if c.get("folds")]
        assert pooled, summary["configs"]
        for c in pooled:
            assert sorted(int(f) for f in c["folds"]) == [0, 1, 2], c
            assert c["clips"] == sum(f["clips"] for f in c["folds"].values()) == n_ref, c
            assert sorted(c["clip_stats"]["ids"]) == names, c
        # one row per gate, budget and language
        assert len({(c["gate_name"], c["budget"], c["language"]) for c in pooled}) == len(pooled)
        assert "Cross-fitted over 3 folds" in (proj / "reports/gates/gates.md").read_text()
    promotion = json.loads((proj / "reports/promotion.json").read_text())
    assert promotion["champion_after"] is not None, promotion
    assert json.loads((proj / "models/wisv/report.json").read_text())["train_mismatches"] > 0

    # the champion from the registry, and from the file the promote stage shipped: the same captions
    wavs = [str(mer / f"{n}.wav") for n in names[:3]]
    captions = {}
    for gate in ("champion", "models/champion.gate.json"):
        cap = subprocess.run([sys.executable, "-m", "speccap.cli", "caption", *wavs, "--mode", "ugsd", "--gate", gate,
                              "--json"], cwd=proj, env=env, capture_output=True, text=True, timeout=300)
        assert cap.returncode == 0, cap.stderr[-3000:]
        captions[gate] = [json.loads(x) for x in cap.stdout.strip().splitlines()]
    assert [c["caption"] for c in captions["champion"]] == [c["caption"] for c in captions["models/champion.gate.json"]]
    assert all(isinstance(c["caption"], str) and c["mode"] == "ugsd" for c in captions["champion"])
    shipped = json.loads((proj / "models/champion.gate.json").read_text())
    assert shipped["registry"]["version"] == promotion["champion_after"]["version"], shipped["registry"]
    # the headline: the one metrics file, naming the promoted gate's row at the promote budget
    headline = json.loads((proj / "reports/headline.json").read_text())
    assert set(headline) == {"en", "zh"} and headline["en"]["gate"]["rho"] >= 0, headline
