"""benchmarks/repro_compare.py: two runs' models, captions and traces compared."""

import importlib.util
import json
from pathlib import Path

_SCRIPT = Path(__file__).parents[1] / "benchmarks" / "repro_compare.py"
_spec = importlib.util.spec_from_file_location("repro_compare", _SCRIPT)
repro_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repro_compare)


def _run(root: Path, caption_b: str, weights: bytes, counter: int = 3) -> Path:
    (root / "reports" / "runs").mkdir(parents=True)
    (root / "models" / "edge").mkdir(parents=True)
    (root / "data" / "traces").mkdir(parents=True)
    (root / "models" / "edge" / "model.safetensors").write_bytes(weights)
    rows = [{"id": "a", "caption": "calm", "tokens": 3, "wall_time": 0.1},
            {"id": "b", "caption": caption_b, "tokens": counter, "wall_time": 0.2}]
    for name in ("edge-en-1", "ugsd-en-entropy1-L5-rank2-N2-2"):
        (root / "reports" / "runs" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    order = ['{"id": "a"}\n', '{"id": "b"}\n']
    (root / "data" / "traces" / "train.en.jsonl").write_text("".join(order if caption_b == "sad" else order[::-1]))
    return root


def test_same_runs_agree_and_differences_are_found(tmp_path):
    a = _run(tmp_path / "a", "sad", b"w1")
    same = repro_compare.compare_runs(a, _run(tmp_path / "b", "sad", b"w1"))
    assert all(m["same"] for m in same["models"]) and all(t["same"] for t in same["traces"])
    assert all(c["same_captions"] == c["same_counters"] == 2 for c in same["configs"])
    # a different caption, counter and weights; the wall time is measured, so it may differ
    other = repro_compare.compare_runs(a, _run(tmp_path / "c", "happy", b"w2", counter=4))
    assert [m["same"] for m in other["models"]] == [False]
    edge = next(c for c in other["configs"] if "edge" in c["config"])
    assert (edge["same_captions"], edge["same_counters"], edge["clock_driven"]) == (1, 1, False)
    assert next(c for c in other["configs"] if "-N2-" in c["config"])["clock_driven"]
    assert all(t["same"] for t in other["traces"])  # the same records in another order
    assert "| model files (sha256) | 0 of 1 |" in repro_compare.markdown(other)
