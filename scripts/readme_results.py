"""Rewrite the numbers of the README and of docs/results.md from the report files, so none is typed by hand.

    python scripts/readme_results.py            # after `make repro` (and benchmarks/pipeline.py)
    python scripts/readme_results.py --check    # exit 1 if the README's summary differs from its reports

The README's summary (between `<!-- summary:begin -->` and `<!-- summary:end -->`) comes from
reports/gates/gates.json and reports/promotion.json (the gate that ships), which git tracks, so the
check runs on any clone (tests/test_readme.py).
docs/results.md's block (`<!-- results:begin -->` .. `<!-- results:end -->`) comes from
reports/metrics.json and reports/decode_summary.json (the report and decode stages),
models/train_report.json (train) and reports/pipeline.json (benchmarks/pipeline.py): written only
where a repro left them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from speccap.pipeline.markdown import md_table
from speccap.pipeline.quality_table import METRICS, format_ci

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SUMMARY = ("<!-- summary:begin -->", "<!-- summary:end -->")
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
            edge_wrong, cloud_wrong = wrong.get((lang, "edge")), wrong.get((lang, "cloud"))
            checks += [
                [f"{lang}: cloud − edge BLEU-1 ≥ +{TARGETS['bleu1']:g}", f"{d['bleu1']['value']:+.1f}",
                 _met(d["bleu1"]["value"] >= TARGETS["bleu1"])],
                [f"{lang}: cloud − edge emotion hit ≥ +{TARGETS['emotion_hit_rate']:g} points",
                 f"{d['emotion_hit_rate']['value']:+.1f}", _met(d["emotion_hit_rate"]["value"] >= TARGETS["emotion_hit_rate"])],
                [f"{lang}: cloud better on BLEU-1, METEOR and ROUGE-L (CI of the difference above 0)",
                 ", ".join(f"{d[k]['ci_low']:+.1f}" for k in ("bleu1", "meteor", "rouge_l")) + " (lower bounds)",
                 _met(all(d[k]["ci_low"] > 0 for k in ("bleu1", "meteor", "rouge_l")))],
                [f"{lang}: cloud emotion hit ≥ {TARGETS['cloud_emotion']:g}%", f"{cloud_emo:.1f}%",
                 _met(cloud_emo >= TARGETS["cloud_emotion"])],
                [f"{lang}: wrong-language rate 0", f"edge {edge_wrong}%, cloud {cloud_wrong}%",
                 _met(edge_wrong == 0 and cloud_wrong == 0)]]
    if train:
        secs = {r: train[r]["train_seconds"] for r in ("edge", "cloud") if "train_seconds" in train.get(r, {})}
        if secs:
            turns = train.get("side_by_side", 2) == 1  # one after the other: the stage takes their sum
            wall = sum(secs.values()) if turns else max(secs.values())
            threads = "/".join(str(train[r].get("threads", "?")) for r in ("edge", "cloud") if r in train)
            how = "one after the other" if turns else "side by side"
            checks.append([f"training ≤ {TARGETS['train_s'] / 60:g} min ({how}, {threads} threads)",
                           f"edge {secs.get('edge', 0) / 60:.1f} + cloud {secs.get('cloud', 0) / 60:.1f}: "
                           f"{wall / 60:.1f} min", _met(wall <= TARGETS["train_s"])])
    if bench:
        checks.append([f"`dvc repro` from a clean clone ≤ {TARGETS['repro_s'] / 60:g} min (`reports/pipeline.md`, "
                       f"commit {bench.get('commit', '?')})", f"{bench['dvc_repro_seconds'] / 60:.1f} min (no-op "
                       f"{bench['noop_dvc_repro_seconds']:.1f} s)", _met(bench["dvc_repro_seconds"] <= TARGETS["repro_s"])])
    out.append("\nThe testbed issue's targets, as measured:\n\n" + md_table(["target", "measured", ""], checks) + "\n")
    gates = _load("reports/gates/gates.json")
    if gates and gates.get("languages"):
        out.append(_gate_tables(gates))
    return "".join(out)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _ceiling(target: dict, key: str) -> str:
    """The ceiling's share of a gap at the gate's budget and the gate's on the same clips, or a dash."""
    c = target.get("ceiling", {}).get(key)
    return "–" if c is None else f"{c['ceiling']:.0f} ({c['gate']:.0f})"


def _gate_tables(gates: dict) -> str:
    """The token gates at every budget rho* <= 0.1 against the gates issue's targets (one table per
    language), the R flagged tokens are judged by, and the DAgger rounds."""
    clips = sorted({e["clips"] for r in gates["languages"].values() for v in r["gates"].values() for e in v})
    out = [f"\nToken gates at budgets rho* <= 0.1 on {clips[-1]} test clips per language (`reports/gates/gates.md`; "
           "gap closed in %, 95% CIs; entropy per token (temperature tuned on validation) / per block and the "
           "oracle at about the same rho, point estimates; the ceiling at the same budget on its clips, with the "
           "gate's share on those clips beside it; "
           "the gates issue's targets: >= 80% of both gaps, CI lower bound above entropy's points, <= "
           "1.05x edge-only time and <= 15% of cloud-only's cloud compute on the papers' hardware):\n"]
    header = ["gate", "rho*", "rho", "BLEU-1 gap closed", "entropy", "oracle", "ceiling (gate)", "emotion gap closed",
              "entropy", "oracle", "ceiling (gate)", ">= 80% of both", "CI above entropy", "x edge-only time",
              "x cloud compute"]
    for lang, r in gates["languages"].items():
        rows = []
        for name, entries in r["targets"]["gates"].items():
            for t in entries:
                b, e = t["bleu1"], t["emotion_hit_rate"]
                rows.append([f"`{name}`", f"{t['budget']:g}", f"{t['rho']:.3f}", format_ci(b["share"]),
                             _pair(b["entropy_point"]), f"{b['oracle']:.0f}", _ceiling(t, "bleu1"), format_ci(e["share"]),
                             _pair(e["entropy_point"]), f"{e['oracle']:.0f}", _ceiling(t, "emotion_hit_rate"),
                             _met(t["closes_80"]),
                             _met(b["ci_low_above_entropy"] and e["ci_low_above_entropy"]),
                             f"{t['papers_x_edge']:.2f}", f"{t['cloud_compute_vs_cloud_only']:.2f}"])
        out.append(f"\n**{lang}**\n\n" + md_table(header, rows) + "\n")
    vr = gates.get("verify_rank")
    if vr and vr.get("validation"):
        rows = []
        for lang, r in vr["chosen"].items():
            other = 1 if r == vr["default"] else r
            d = vr["validation"][lang].get(str(other), {}).get("minus_default")
            rows.append([lang, r, "–" if d is None else f"R = {other} vs {vr['default']}: {format_ci(d, True)}"])
        out.append("\nThe R flagged tokens are judged by (rank-R), chosen per language on validation by the mean "
                   "of BLEU-1 and emotion hit:\n\n" + md_table(["language", "R", "paired difference, 95% CI"], rows)
                   + "\n")
    rounds = gates.get("dagger", [])
    if rounds:
        rows = [[r["round"], f"`{r['gate']}`", f"{r['val_auc_before']['critical']:.3f}",
                 f"{r.get('chosen_after', 'the chosen gate')}", f"{r['val_auc_after']['critical']:.3f}"] for r in rounds]
        out.append("\nDAgger rounds: the gate on the trajectories it led to (validation), AUC on critical "
                   "mismatches before and after training again on them:\n\n"
                   + md_table(["round", "gate", "AUC before", "trained again", "AUC after"], rows) + "\n")
    return "".join(out)


def _pair(points: dict) -> str:
    return f"{points.get('entropy', float('nan')):.0f} / {points.get('entropy-block', float('nan')):.0f}"


def _cell(m: dict | None) -> str:
    return format_ci(m) if m else "–"


# the budgets the README's summary states the gates at (the gates issue's: 75% of both gaps at
# rho* <= 0.05, 90% at <= 0.07, and 0.1 where the learned gate and entropy used to meet)
SUMMARY_BUDGETS = (0.05, 0.1)


def render_summary() -> str:
    """Per language: edge-only; at each of SUMMARY_BUDGETS the entropy gate per token (at the
    temperature tuned on validation), the learned gate that ships (the promoted champion,
    reports/promotion.json) and the ceiling; the oracle and cloud-only; from reports/gates/gates.json."""
    gates, promotion = _load("reports/gates/gates.json"), _load("reports/promotion.json")
    if not gates or not gates.get("languages") or not promotion:
        raise SystemExit("reports/gates/gates.json or reports/promotion.json not found: run `make repro` first")
    champion = promotion["champion_after"]["tags"]["gate"]
    temps = gates.get("entropy_temperature", {})
    out = []
    for lang, r in gates["languages"].items():
        def at(name, b, entries=r["gates"]):
            return next((e for e in entries.get(name, []) if e.get("budget") == b), None)
        rows = [("edge-only (the device alone)", "–", r["edge"])]
        for b in SUMMARY_BUDGETS:
            t = temps.get(str(b), {}).get(lang)
            rows += [(f"entropy gate, per token{'' if t is None else f' (T = {t:g}, tuned on validation)'}", b,
                      at("entropy", b)),
                     ("entropy gate, per token, T = 1 (untuned)", b, at("entropy (T = 1)", b)),
                     (f"learned gate `{champion}` (promoted: what ships)", b, at(champion, b)),
                     (f"ceiling (best choice of corrections, first {(at('ceiling', b) or {}).get('clips', '?')} "
                      "clips)", b, at("ceiling", b))]
        rows += [("oracle (every mismatch sent)", "–", next(iter(r["gates"].get("oracle", [])), None)),
                 ("cloud-only (the cloud captions alone)", "–", r["cloud"])]
        clips = (at(champion, SUMMARY_BUDGETS[0]) or {}).get("clips", "?")
        lines = [f"**{lang}** ({clips} test clips)", "",
                 "| | budget rho* | tokens sent (rho) | BLEU-1 | emotion hit % | BLEU-1 gap closed % | "
                 "emotion gap closed % |", "|---|---|---|---|---|---|---|"]
        for label, b, e in rows:
            if e is None:
                continue
            rho = f"{e['rho']:.3f}" if "rho" in e else ("0" if label.startswith("edge") else "1")
            lines.append(f"| {label} | {b} | {rho} | {_cell(e.get('bleu1'))} | {_cell(e.get('emotion_hit_rate'))} | "
                         f"{_cell(e.get('gap_closed_bleu1'))} | {_cell(e.get('gap_closed_emotion_hit_rate'))} |")
        out.append("\n".join(lines) + "\n")
    return ("Gates at budgets rho* = " + " and ".join(f"{b:g}" for b in SUMMARY_BUDGETS) + " (at most that share of "
            "tokens sent to the cloud), 95% paired-bootstrap intervals (`reports/gates/gates.md`; written by "
            "`scripts/readme_results.py`). The ceiling knows the cloud's answers and the references: it bounds "
            "what choosing corrections can buy, and it can close more than the whole gap.\n\n" + "\n".join(out))


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
