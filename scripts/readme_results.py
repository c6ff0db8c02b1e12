"""Rewrite the numbers of the README and of docs/results.md from the report files, so none is typed by hand.

    python scripts/readme_results.py            # after `make repro` (and benchmarks/pipeline.py)
    python scripts/readme_results.py --check    # exit 1 if the README's summary differs from its reports

The README's summary (between `<!-- summary:begin -->` and `<!-- summary:end -->`) comes from
reports/gates/gates.json, which git tracks, so the check runs on any clone (tests/test_readme.py).
docs/results.md's block (`<!-- results:begin -->` .. `<!-- results:end -->`) comes from
reports/metrics.json and reports/decode_summary.json (the report and decode stages),
models/train_report.json (train) and reports/pipeline.json (benchmarks/pipeline.py): written only
where a repro left them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from speccap.config import load_params
from speccap.pipeline.quality_table import METRICS, format_ci

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SUMMARY = ("<!-- summary:begin -->", "<!-- summary:end -->")
SUMMARY_BUDGET = 0.1  # the budget rho* the README's table shows (the gates issue's)
LABELS = {"edge": "edge-only", "ugsd": "UGSD default", "cloud": "cloud-only"}
KEYS = METRICS
# the testbed issue's targets: cloud - edge on BLEU-1 and emotion hit, the cloud's emotion hit
TARGETS = {"bleu1": 8.0, "emotion_hit_rate": 25.0, "cloud_emotion": 80.0, "repro_s": 1800, "train_s": 600}


def _load(rel: str) -> dict | None:
    p = ROOT / rel
    return json.loads(p.read_text()) if p.exists() else None


def render() -> str:
    metrics = _load("reports/metrics.json")
    if metrics is None or "intervals" not in metrics:
        raise SystemExit("reports/metrics.json with intervals not found: run `make repro` first")
    summary = _load("reports/decode_summary.json") or {"configs": []}
    train = _load("models/train_report.json") or {}
    bench = _load("reports/pipeline.json")
    wrong = {(c["language"], c["method"]): c["metrics"].get("wrong_language_rate")
             for c in summary["configs"] if c.get("status") == "FINISHED" and c["method"] in ("edge", "cloud")}
    out = ["Numbers x100 with 95% paired-bootstrap intervals over the test clips (`reports/tables/quality.md`, "
           "`reports/metrics.json`); written by `scripts/readme_results.py` from the report files.\n"]
    checks = []
    for lang, ci in metrics["intervals"].items():
        rows = []
        for m, label in LABELS.items():
            mm = ci["methods"].get(m)
            if mm:
                rows.append(f"| {label} | " + " | ".join(format_ci(mm[k]) if k in mm else "–" for k, _ in KEYS) + " |")
        d = ci["differences"].get("cloud-edge", {})
        if d:
            rows.append("| cloud − edge | " + " | ".join(format_ci(d[k], True) if k in d else "–" for k, _ in KEYS) + " |")
        out.append(f"\n**{lang}**\n\n| | " + " | ".join(n for _, n in KEYS) + " |\n|---|---|---|---|---|\n"
                   + "\n".join(rows) + "\n")
        g = ci.get("ugsd_gap_closed", {}).get("bleu1")
        if g:
            out.append(f"\nUGSD at the default gate closes {format_ci(g)} % of the BLEU-1 gap"
                       + ("" if g["significant_gap"] else " (not meaningful: the gap is not significant)") + ".\n")
        if d:
            cloud_emo = ci["methods"]["cloud"].get("emotion_hit_rate", {}).get("value")
            checks += [
                f"{lang}: cloud − edge BLEU-1 {d['bleu1']['value']:+.1f} (target ≥ +{TARGETS['bleu1']:g}): "
                + ("met" if d["bleu1"]["value"] >= TARGETS["bleu1"] else "NOT met"),
                f"{lang}: cloud − edge emotion hit {d['emotion_hit_rate']['value']:+.1f} points (target ≥ "
                f"+{TARGETS['emotion_hit_rate']:g}): "
                + ("met" if d["emotion_hit_rate"]["value"] >= TARGETS["emotion_hit_rate"] else "NOT met"),
                f"{lang}: cloud better on BLEU-1, METEOR and ROUGE-L with the CI of the difference above 0: "
                + ("met" if all(d[k]["ci_low"] > 0 for k in ("bleu1", "meteor", "rouge_l")) else "NOT met"),
                f"{lang}: cloud emotion hit {cloud_emo:.1f}% (target ≥ {TARGETS['cloud_emotion']:g}%): "
                + ("met" if cloud_emo >= TARGETS["cloud_emotion"] else "NOT met"),
                f"{lang}: wrong-language rate edge {wrong.get((lang, 'edge'))}%, cloud {wrong.get((lang, 'cloud'))}% "
                "(target 0)"]
    if train:
        secs = {r: train[r]["train_seconds"] for r in ("edge", "cloud") if "train_seconds" in train.get(r, {})}
        if secs:
            turns = train.get("side_by_side", 2) == 1  # one after the other: the stage takes their sum
            wall = sum(secs.values()) if turns else max(secs.values())
            threads = "/".join(str(train[r].get("threads", "?")) for r in ("edge", "cloud") if r in train)
            how = "one after the other" if turns else "side by side"
            checks.append(f"training ({how}, {threads} threads): edge {secs.get('edge', 0) / 60:.1f} min, "
                          f"cloud {secs.get('cloud', 0) / 60:.1f} min, {wall / 60:.1f} min in all "
                          f"(target ≤ {TARGETS['train_s'] / 60:g} min): "
                          + ("met" if wall <= TARGETS["train_s"] else "NOT met"))
    if bench:
        checks.append(f"`dvc repro` from a clean clone (`reports/pipeline.md`, commit {bench.get('commit', '?')}): "
                      f"{bench['dvc_repro_seconds'] / 60:.1f} min (target ≤ 30): "
                      + ("met" if bench["dvc_repro_seconds"] <= TARGETS["repro_s"] else "NOT met")
                      + f"; a no-op `dvc repro` {bench['noop_dvc_repro_seconds']:.1f} s")
    out.append("\nThe testbed issue's targets, as measured:\n\n" + "\n".join(f"- {c}" for c in checks) + "\n")
    gates = _load("reports/gates/gates.json")
    if gates and gates.get("languages"):
        lines = [f"{lang}: {line}" for lang, r in gates["languages"].items() for line in r["targets"]["lines"]]
        clips = sorted({e["clips"] for r in gates["languages"].values() for v in r["gates"].values() for e in v})
        main = load_params().gates.targets[0]  # the target whose chosen gate runs on every test clip
        where = (f"every gate on all {clips[-1]} test clips" if len(clips) == 1 else
                 f"the {main}-target gates on all {clips[-1]} test clips, the other targets' on the first {clips[0]}")
        out.append(f"\nToken gates at budgets rho* <= 0.1 (`reports/gates/gates.md`, 95% CIs; {where}; the "
                   "gates issue's targets: >= 80% of both gaps, CI lower bound above entropy's point estimates, "
                   "<= 1.05x edge-only time and <= 15% of cloud-only's cloud compute on the papers' hardware):\n\n"
                   + "\n".join(f"- {x}" for x in lines) + "\n")
        vr = gates.get("verify_rank")
        if vr and vr.get("validation"):
            parts = []
            for lang, r in vr["chosen"].items():
                d = vr["validation"][lang].get("1" if r == vr["default"] else str(r), {}).get("minus_default")
                other = "" if d is None else (f" (R = {r if r != vr['default'] else 1} vs {vr['default']}: "
                                              f"{d['value']:+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}])")
                parts.append(f"{lang} R = {r}{other}")
            out.append("\nFlagged tokens are judged by rank-R with R chosen per language on validation (mean of "
                       "BLEU-1 and emotion hit, paired 95% CI): " + "; ".join(parts) + ".\n")
        for r in gates.get("dagger", []):
            b, a = r["val_auc_before"], r["val_auc_after"]
            out.append(f"\nDAgger round {r['round']} (`reports/gates/gates.md`): {r['gate']} on the trajectories it "
                       f"led to (validation) ranked critical mismatches with AUC {b['critical']:.3f}; trained again "
                       f"on them, {r.get('chosen_after', 'the chosen gate')} {a['critical']:.3f}.\n")
    return "".join(out)


def _cell(m: dict | None) -> str:
    return format_ci(m) if m else "–"


def render_summary() -> str:
    """Per language: edge-only, the entropy gate (UGSD's uncertainty score, per token), the main
    learned gate, the oracle and cloud-only, at the budget SUMMARY_BUDGET, from reports/gates/gates.json."""
    gates = _load("reports/gates/gates.json")
    if not gates or not gates.get("languages"):
        raise SystemExit("reports/gates/gates.json not found: run `make repro` first")
    main = load_params().gates.targets[0]
    out = []
    for lang, r in gates["languages"].items():
        named = {g: next((e for e in entries if e.get("budget") == SUMMARY_BUDGET), None)
                 for g, entries in r["gates"].items()}
        learned = next((g for g in r["gates"] if g.startswith("tok-") and g.endswith(f"-{main}")), None)
        oracle = next((e for e in r["gates"].get("oracle", [])), None)
        rows = [("edge-only (the device alone)", r["edge"]), ("entropy gate, per token", named.get("entropy")),
                (f"learned gate `{learned}`", named.get(learned)), ("oracle (every mismatch sent)", oracle),
                ("cloud-only (the cloud captions alone)", r["cloud"])]
        clips = (named.get(learned) or {}).get("clips", "?")
        lines = [f"**{lang}** ({clips} test clips)", "",
                 "| | tokens sent (rho) | BLEU-1 | emotion hit % | BLEU-1 gap closed % | emotion gap closed % |",
                 "|---|---|---|---|---|---|"]
        for label, e in rows:
            if e is None:
                continue
            rho = f"{e['rho']:.3f}" if "rho" in e else ("0" if label.startswith("edge") else "1")
            lines.append(f"| {label} | {rho} | {_cell(e.get('bleu1'))} | {_cell(e.get('emotion_hit_rate'))} | "
                         f"{_cell(e.get('gap_closed_bleu1'))} | {_cell(e.get('gap_closed_emotion_hit_rate'))} |")
        out.append("\n".join(lines) + "\n")
    return ("Gates at a budget of rho* = " + f"{SUMMARY_BUDGET:g}" + " (at most that share of tokens sent to the "
            "cloud), on every test clip, 95% paired-bootstrap intervals (`reports/gates/gates.md`; written by "
            "`scripts/readme_results.py`):\n\n" + "\n".join(out))


def _replace(path: Path, markers: tuple[str, str], body: str) -> str:
    text = path.read_text()
    begin, end = markers
    if begin not in text or end not in text:
        sys.exit(f"{path}: the markers {begin} / {end} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "\n" + body + end + tail


def main() -> None:
    readme, results = ROOT / "README.md", ROOT / "docs" / "results.md"
    want = _replace(readme, SUMMARY, render_summary())
    if "--check" in sys.argv[1:]:
        if want != readme.read_text():
            sys.exit(f"{readme}: its summary differs from reports/gates/gates.json: run scripts/readme_results.py")
        print(f"{readme}: summary matches its reports")
        return
    readme.write_text(want)
    print(f"{readme}: summary rewritten")
    if (ROOT / "reports" / "metrics.json").exists():
        results.write_text(_replace(results, (BEGIN, END), render()))
        print(f"{results}: results block rewritten")
    else:
        print(f"{results}: left as it is (no reports/metrics.json: run `make repro` first)")


if __name__ == "__main__":
    main()
