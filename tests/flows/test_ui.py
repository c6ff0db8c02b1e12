"""The views a newcomer opens, checked in a real browser (Debian's headless Chromium, driven by Selenium):
MLflow's runs page and compare view over a real decode sweep's runs, and Prefect's runs page listing the
flow run. Screenshots go to the test's folder, and to $SPECCAP_SCREENSHOTS when set
(`SPECCAP_SCREENSHOTS=docs/img pytest tests/flows/test_ui.py` made docs/img/)."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from speccap.run_views import compare_page, runs_page
from speccap.tracking import Tracker

from .daemons import missing, mlflow_server, prefect_server, stop

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_server")]

ROOT = Path(__file__).resolve().parents[2]
_ASSISTANT_CLOSE = "mlflow.assistant.chat_panel.close"


@pytest.fixture
def browser():
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        missing("Chromium", "chromium and chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1920,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _page(driver, url: str, want: list[str], shot: Path, timeout: float = 90.0) -> str:
    """Open `url`, wait until the page's text holds every string of `want`, save a screenshot; the text."""
    driver.get(url)
    deadline = time.monotonic() + timeout
    while True:
        for close in driver.find_elements("css selector", f'[data-component-id="{_ASSISTANT_CLOSE}"]'):
            close.click()  # MLflow's chat panel opens by itself on a browser's first visit, over the columns
        text = driver.find_element("tag name", "body").text
        if all(w in text for w in want) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    driver.save_screenshot(str(shot))
    if os.environ.get("SPECCAP_SCREENSHOTS"):
        out = Path(os.environ["SPECCAP_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / shot.name)
    assert all(w in text for w in want), (url, [w for w in want if w not in text], text[:2000])
    return text


def test_mlflow_opens_on_the_runs_and_prefect_lists_the_flow_run(browser, tiny_project, tmp_path):
    _, _, params_file = tiny_project
    with prefect_server(f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}", tmp_path / "prefect") as api:
        raw = yaml.safe_load(params_file.read_text())
        raw["sweep"] |= {"runs_dir": str(tmp_path / "runs"), "block_lens": [2]}
        store = f"sqlite:///{tmp_path / 'mlflow.db'}"
        raw["tracking"] = {"uri": store, "experiment": "speccap", "prefect_api_url": api}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
        env |= {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "SPECCAP_PARAMS": str(tmp_path / "params.yaml")}
        sweep = subprocess.Popen([sys.executable, "-c", "from flows.decode import decode_flow; decode_flow('params.yaml')"],
                                 cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out = sweep.communicate(timeout=600)[0]
        finally:
            stop(sweep)
        assert sweep.returncode == 0, out[-3000:]

        tracker = Tracker(store, "speccap")
        runs = tracker.runs()
        nested = [r for r in runs if "config_id" in r["tags"]]
        parent = next(r for r in runs if "config_id" not in r["tags"])
        ugsd = [r for r in nested if r["name"].startswith("ugsd")][:2]
        assert len(ugsd) == 2
        first = min(r["name"] for r in nested)  # the view orders rows by name
        with mlflow_server(store, tmp_path / "artifacts") as ui:
            # the experiment's view: the configurations as rows (not collapsed under their sweep),
            # the headline metrics as columns
            text = _page(browser, runs_page(ui, tracker.experiment_id),
                         ["Runs", first, "bleu1", "emotion_hit_rate", "rho", "language"], tmp_path / "mlflow_runs.png")
            assert "Token Usage" not in text and "Tool calls" not in text  # not the GenAI overview
            assert parent["name"] not in text  # the sweep run that groups them is filtered out
            _page(browser, compare_page(ui, tracker.experiment_id, [r["run_id"] for r in ugsd]),
                  ["Comparing 2 Runs", *(r["name"] for r in ugsd), "Metrics", "bleu1"],  # (a virtual list: the first rows)
                  tmp_path / "mlflow_compare.png")
        _page(browser, api.removesuffix("/api") + "/runs", ["speccap-decode"], tmp_path / "prefect_runs.png")
