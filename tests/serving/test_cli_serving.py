"""The README's two commands: `speccap serve-cloud` in one process, `speccap edge` in another."""

import json
import subprocess

import pytest

from speccap.cli import main
from speccap.data.manifest import manifest_path, read_manifest

from .conftest import TOKEN, free_port, wait_until_up


@pytest.mark.e2e
def test_serve_cloud_and_edge_commands(tiny_project, capsys, tmp_path, monkeypatch):
    params, _, params_file = tiny_project
    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(["speccap", "--params", str(params_file), "serve-cloud", "--port", str(port),
                             "--token-file", str(token_file), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_up(proc, url)
        opts = ["caption", wav, "--gate", "always", "--block-len", "3", "--rule", "greedy", "--json"]
        assert main(["--params", str(params_file), "edge", "--server", url, "--token-file", str(token_file),
                     "--wire-dtype", "float32", *opts[1:]]) == 0
        net = json.loads(capsys.readouterr().out)
        assert main(["--params", str(params_file), *opts, "--mode", "ugsd"]) == 0
        local = json.loads(capsys.readouterr().out)
        assert net["mode"] == "networked" and net["caption"] == local["caption"]
        assert net["rounds"] == local["rounds"] >= 1 and net["fallback"] == 0
        assert net["net_rtt"] > 0 and net["link_model_time"] > 0 and net["http_bytes_up"] > net["bytes_up"]
        # plain output says what was measured; a wrong token is a clear error, not a traceback
        monkeypatch.setenv("SPECCAP_TOKEN", "not-the-right-token-at-all")
        assert main(["--params", str(params_file), "edge", "--server", url, wav]) == 2
        assert "401" in capsys.readouterr().err
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert TOKEN not in out  # never logged
    assert "verifier for cloud:embedded" in out


@pytest.mark.e2e
def test_edge_with_the_wisv_rule_against_serve_cloud_with_a_head(tiny_project, capsys, tmp_path):
    # the server loads the head (--wisv-head), the edge sends tau, the channel state and the states;
    # the caption is the in-process one (`speccap caption --rule wisv` with the same head)
    import torch

    from speccap.decoding.wisv.head import DecisionHead, save_head
    params, _, params_file = tiny_project
    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    torch.manual_seed(0)
    head = tmp_path / "head.pt"
    save_head(DecisionHead(params.models.edge.size.text_hidden, 48), head, {})  # the tiny cloud is 48 wide
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(["speccap", "--params", str(params_file), "serve-cloud", "--port", str(port),
                             "--token-file", str(token_file), "--threads", "1", "--wisv-head", str(head)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_up(proc, url)
        opts = [wav, "--gate", "always", "--block-len", "3", "--rule", "wisv", "--tau", "0.5", "--json"]
        assert main(["--params", str(params_file), "edge", "--server", url, "--token-file", str(token_file),
                     "--wire-dtype", "float32", *opts]) == 0
        net = json.loads(capsys.readouterr().out)
        assert main(["--params", str(params_file), "caption", *opts, "--mode", "ugsd", "--wisv-head", str(head)]) == 0
        local = json.loads(capsys.readouterr().out)
        assert net["caption"] == local["caption"] and net["fallback"] == 0 and net["rounds"] == local["rounds"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_serve_cloud_refuses_to_run_without_a_token(tiny_project, capsys, monkeypatch):
    _, _, params_file = tiny_project
    monkeypatch.delenv("SPECCAP_TOKEN", raising=False)
    assert main(["--params", str(params_file), "serve-cloud"]) == 2
    assert "no bearer token" in capsys.readouterr().err


def test_serve_cloud_refuses_a_bad_batch_by_its_option(tiny_project, capsys, monkeypatch):
    _, _, params_file = tiny_project
    monkeypatch.setenv("SPECCAP_TOKEN", "a-token-of-enough-length-0123456789")
    for bad in (["--batch", "0"], ["--batch", "4", "--batch-window-ms", "-1"]):
        assert main(["--params", str(params_file), "serve-cloud", *bad]) == 2
        assert "--batch must be at least 1" in capsys.readouterr().err


def test_edge_reports_an_unreachable_server(tiny_project, capsys, monkeypatch):
    params, _, params_file = tiny_project
    wav = read_manifest(manifest_path(params.data.processed_dir, "test", "en"))[0]["path"]
    monkeypatch.setenv("SPECCAP_TOKEN", TOKEN)
    assert main(["--params", str(params_file), "edge", "--server", f"http://127.0.0.1:{free_port()}",
                 "--retries", "0", wav]) == 2
    assert "cannot connect" in capsys.readouterr().err
