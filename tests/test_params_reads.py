"""The recorder of params reads (speccap.params_reads), run as a stage runs it: in a fresh process with
$SPECCAP_RECORD_PARAMS set, with a worker process of its own, and the check it feeds (stage_params)."""

import subprocess
import sys
import textwrap

import pytest

from speccap.params_reads import recorded
from speccap.stage_params import READ_NOT_RESULTS, STAGE_PARAMS, uncovered, unread

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, pickle
    from speccap.config import gate_decode, params_from_dict
    from speccap.preflight import check_stage

    def in_worker(link):
        return link.rtt_ms

    if __name__ == "__main__":
        p = params_from_dict({})
        p.decode.temperature                      # a leaf by its path
        d = gate_decode(p)                        # replace(): copies keep their keys
        d.rule, d.block_len                       # decode.rule; block_len came from gates.traces
        p.sweep.clips
        check_stage(p, "decode")                  # checks inputs: its reads are not the stage's
        with mp.get_context("spawn").Pool(1) as pool:
            pool.apply(in_worker, (p.link,))      # a section unpickled in a worker: keyed by its class
    """)


@pytest.mark.e2e
def test_a_stage_records_the_keys_it_and_its_workers_read(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {"SPECCAP_RECORD_PARAMS": str(tmp_path / "rec"), "SPECCAP_STAGE": "decode", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "s.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    reads = recorded(tmp_path / "rec")["decode"]
    assert {"decode.temperature", "decode.rule", "gates.traces.block_len", "sweep.clips", "link.rtt_ms"} <= reads
    # replace() copying every field is not a read of them; the loader's cross-field checks are not either
    assert "decode.block_len" not in reads and "decode.edge_time_scale" not in reads
    assert "wisv.channels" not in reads and "features.n_fft" not in reads
    assert "models.edge.backend" not in reads and "data.languages" not in reads


def test_without_the_variable_nothing_is_recorded(tmp_path):
    run = subprocess.run([sys.executable, "-c", "from speccap.config import params_from_dict; "
                          "import dataclasses; print(dataclasses.replace.__module__, params_from_dict({}).seed)"],
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["dataclasses", "0"], run.stderr
    assert not any(tmp_path.iterdir())


def test_a_key_a_stage_reads_and_does_not_list_is_named():
    reads = {"wisv_eval": {"decode.temperature", "wisv.tau", "sweep.runs_dir"}, "unknown": {"everything"}}
    assert uncovered(reads) == []
    table = dict(STAGE_PARAMS, wisv_eval=tuple(k for k in STAGE_PARAMS["wisv_eval"] if k != "decode.temperature"))
    assert uncovered(reads, table) == [
        "stage wisv_eval reads params key decode.temperature, which STAGE_PARAMS['wisv_eval'] does not list "
        "(list it, or declare it in READ_NOT_RESULTS with the reason)"]
    # a declaration covers it, for that stage only
    assert uncovered(reads, table, {**READ_NOT_RESULTS, ("wisv_eval", "decode.temperature"): "why"}) == []
    assert uncovered(reads, table, {**READ_NOT_RESULTS, ("gates", "decode.temperature"): "why"}) != []


def test_entries_nothing_read_are_listed():
    assert unread({"featurize": {"features.n_fft"}}) == {"featurize": ["data.max_clip_seconds", "data.languages"]}
    assert unread({"featurize": {"features.n_fft", "data.max_clip_seconds", "data.languages"}}) == {"featurize": []}
