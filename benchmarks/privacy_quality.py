"""The privacy frontier's quality side: a cloud trained on each candidate uplink, and the share of the
edge -> cloud gap it keeps; for a learned uplink also what it reveals.

    python benchmarks/privacy_quality.py [--candidates 128x8 16x16c L16x8c L16x8c-a1] [--clips 100]

The `privacy` stage measures what each uplink of `privacy.candidates` reveals
(reports/privacy/privacy.md); what the cloud can still caption from it needs a cloud trained on it.
For each candidate ([bands]x[frames merged], `c` for clip-normalised; `L[rows]x[frames merged]` a
learned uplink, `-a[weight]` with a speaker adversary: `uplink:` params): the embedded cloud trained on
that view of the pipeline's features exactly as the `train` stage trains it with those `uplink:`
params (in benchmarks/out/privacy_quality/<candidate>/, the tokenizer shared; a learned uplink's
encoder trained with it), then cloud-only captions of the first `--clips` test clips per language,
the cloud reading that view (`-q<bits>`: each value sent as a code of that many bits). A learned or
quantised uplink is not among the privacy stage's candidates, so here the privacy stage's own
measurement runs on it: speech rebuilt by the learned
inverter (STOI), the voice named and verified by classifiers retrained on it.
Against the decode sweep's edge-only and cloud-only captions of the same clips
(reports/decode_summary.json: the cloud on the log-mel sent today): BLEU-1 and emotion hit with 95%
intervals, and the share of the gap kept, paired over clips. Writes reports/privacy_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

from tqdm import tqdm

from speccap.config import load_params
from speccap.data.featurize import load_clip_features
from speccap.data.manifest import manifest_path, read_manifest
from speccap.data.uplink import Uplink
from speccap.decoding.engine import cloud_only
from speccap.decoding.link import Link
from speccap.metrics.bootstrap import ClipStats, gap_closed, interval
from speccap.metrics.caption import score_captions
from speccap.models.captioners import train_captioners
from speccap.models.loading import load_role
from speccap.params_uplink import LearnedUplinkParams, UplinkParams
from speccap.pipeline.markdown import interval_text
from speccap.pipeline.privacy import measure

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("bleu1", "emotion_hit_rate")


def _candidate_params(params, uplink: UplinkParams, where: Path):
    """params for one candidate: its uplink, its own models folder with the pipeline's tokenizer."""
    models = where / "models"
    if not (models / "tokenizer").exists():
        shutil.copytree(Path(params.models.dir) / "tokenizer", models / "tokenizer")
    return dataclasses.replace(params, uplink=uplink, models=dataclasses.replace(params.models, dir=str(models)))


def parse_candidate(text: str) -> UplinkParams:
    """"128x8" -> 128 bands, 8 frames merged; a trailing "c": clip-normalised; "-q4": each value sent as a
    4-bit code; "L16x8c-a0.5": a learned encoder sending 16 rows per 8 frames, clip-normalised, trained
    against a speaker adversary of weight 0.5 ("L16x8c-a0.5-q4": its values as 4-bit codes, trained so)."""
    try:
        view, _, bits = text.partition("-q")
        view, _, adversary = view.partition("-a")
        norm = "clip" if view.endswith("c") else "none"
        rows, merge = (int(x) for x in view.rstrip("c").lstrip("L").split("x"))
        if view.startswith("L"):
            return UplinkParams(None, merge, norm, LearnedUplinkParams(rows, adversary=float(adversary or 0)),
                                bits=int(bits or 16))
        if adversary:
            raise ValueError("an adversary trains a learned uplink only")
        return UplinkParams(rows, merge, norm, bits=int(bits or 16))
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--candidates {text}: expected [bands]x[merge][c][-q<bits>] or "
                         f"L[rows]x[merge][c][-a<weight>][-q<bits>] ({exc})") from None


def _stats(summary: dict, name: str, ids: list[str]) -> ClipStats:
    cfg = next(c for c in summary["configs"] if c["name"] == name)
    return ClipStats.from_json(cfg["clip_stats"]).subset(ids)


def _cloud_stats(p, cloud, clips: list[dict], lang: str) -> ClipStats:
    caps = []
    for i, rec in enumerate(tqdm(clips, desc=f"cloud-only {lang}", unit="clip")):
        mel = load_clip_features(p.data.processed_dir, rec["id"])[0]
        caps.append(cloud_only(cloud, mel, lang, Link(p.link, seed=i), p.models.max_new_tokens).caption)
    s = score_captions(caps, [c["references"] for c in clips], lang, [c.get("emotion") for c in clips])
    return ClipStats.from_records([c["id"] for c in clips], s.per_caption)


def _revealed(p, where: Path) -> dict:
    """The privacy stage's measurement of the candidate alone (kept in the candidate's folder)."""
    path = where / "privacy.json"
    if not path.exists():
        solo = dataclasses.replace(p, privacy=dataclasses.replace(p.privacy, candidates=()))
        path.write_text(json.dumps(measure(solo, workers=2), indent=1))
    return json.loads(path.read_text())


def run(candidates: list[str], n_clips: int, out_root: Path) -> dict:
    params = load_params()
    summary = json.loads((ROOT / "reports" / "decode_summary.json").read_text())
    test = {lang: read_manifest(manifest_path(params.data.processed_dir, "test", lang))[:n_clips]
            for lang in params.data.languages}
    rows = []
    for name in candidates:
        uplink = parse_candidate(name)
        where = out_root / name
        p = _candidate_params(params, uplink, where)
        if not (where / "models" / "cloud" / "config.json").exists():
            train_captioners(p, roles=("cloud",))
        cloud = load_role(p, "cloud")
        if uplink.learned is None:
            assert cloud.uplink == Uplink.from_params(uplink), f"{where}: a cloud trained on another uplink"
        row = {"candidate": name, "name": cloud.uplink.name(params.features.n_mels, params.features.hop_length),
               **dataclasses.asdict(uplink), "languages": {},
               "bytes_per_second": cloud.uplink.bytes_per_second(params.features.n_mels, params.features.sample_rate,
                                                                 params.features.hop_length)}
        if uplink.learned is not None or uplink.bits < 16:  # not among the privacy stage's candidates
            row["privacy"] = _revealed(p, where)
        for lang, clips in test.items():
            ids = [c["id"] for c in clips]
            edge, logmel = _stats(summary, f"edge-{lang}", ids), _stats(summary, f"cloud-{lang}", ids)
            cand = _cloud_stats(p, cloud, clips, lang)
            row["languages"][lang] = {
                "clips": len(ids),
                **{k: {"edge": interval(edge, k), "cloud (log-mel)": interval(logmel, k), "cloud": interval(cand, k),
                       "gap_kept": gap_closed(edge, cand, logmel, k)} for k in KEYS}}
        rows.append(row)
        print(json.dumps({"candidate": name, "bleu1": {
            lang: round(v["bleu1"]["cloud"]["value"], 1) for lang, v in row["languages"].items()}}), flush=True)
    return {"command": " ".join(["python", "benchmarks/privacy_quality.py", "--candidates", *candidates,
                                 "--clips", str(n_clips)]), "clips_per_language": n_clips,
            "hop_length": params.features.hop_length, "candidates": rows}


def markdown(r: dict) -> str:
    made = "` and `".join(r.get("commands", [r["command"]]))
    lines = ["# The quality side of the privacy frontier", "",
             f"Made by `{made}`: per candidate uplink (speccap.data.uplink), the embedded cloud trained on it "
             "as the `train` stage trains the cloud with those `uplink:` params, cloud-only captions of the first "
             f"{r['clips_per_language']} test clips per language, against the decode sweep's edge-only and "
             "cloud-only (log-mel sent today) captions of the same clips; 95% intervals, paired over clips. "
             "What each representation reveals: reports/privacy/privacy.md.", "",
             "| representation | language | cloud BLEU-1 | edge-to-cloud BLEU-1 gap kept % | cloud emotion hit % | "
             "emotion-hit gap kept % |", "|---|---|---|---|---|---|"]
    for c in r["candidates"]:
        for lang, v in c["languages"].items():
            cells = []
            for k in KEYS:
                g = v[k]["gap_kept"]
                kept = interval_text(g) if g["significant_gap"] else f"{interval_text(g)} (gap inside the noise)"
                cells += [interval_text(v[k]["cloud"]), kept]
            lines.append(f"| {label(c)} | {lang} | " + " | ".join(cells) + " |")
    lines += ["", "For reference, on the same clips:", "", "| language | edge BLEU-1 | cloud BLEU-1 (log-mel) | "
              "edge emotion hit % | cloud emotion hit % (log-mel) |", "|---|---|---|---|---|"]
    for lang, v in r["candidates"][0]["languages"].items():
        lines.append(f"| {lang} | {interval_text(v['bleu1']['edge'])} | {interval_text(v['bleu1']['cloud (log-mel)'])} | "
                     f"{interval_text(v['emotion_hit_rate']['edge'])} | {interval_text(v['emotion_hit_rate']['cloud (log-mel)'])} |")
    return "\n".join(lines + frontier(r)) + "\n"


def revealed(c: dict, stage: dict) -> dict | None:
    """What the candidate reveals: measured here for a learned or quantised uplink, by the privacy stage for a
    view."""
    if "privacy" in c:
        return c["privacy"]["wires"][0]
    return next((w for w in stage["wires"] if w["name"] == c["name"]), None)


def label(c: dict) -> str:
    """The representation's name, and for a learned one whether it trained against a speaker adversary."""
    adversary = (c.get("learned") or {}).get("adversary", 0)
    return f"{c['candidate']}: {c['name']}" + (f", speaker adversary {adversary:g}" if adversary else "")


def worst_kept(c: dict) -> float:
    """The smallest share kept of the four gaps (two metrics, two languages): what the target holds."""
    return min(v[k]["gap_kept"]["value"] for v in c["languages"].values() for k in KEYS)


def frontier(r: dict) -> list[str]:
    """Every candidate with what it reveals (the privacy stage's attackers, the stronger counting) and the
    gaps the cloud keeps, against issue 50's targets; which constraint binds first."""
    stage = json.loads((ROOT / "reports" / "privacy" / "privacy.json").read_text())
    rows, points = [], []
    for c in r["candidates"]:
        w = revealed(c, stage)
        if w is None:
            continue
        kept = [interval_text(c["languages"][lang][k]["gap_kept"]) for lang in c["languages"] for k in KEYS]
        v = w["voice_id"]
        rate = c.get("bytes_per_second", w["bytes_per_second"])
        rows.append(f"| {label(c)} | {rate:.0f} | {interval_text(w['stoi'], 3)} ({w['stoi_attacker']}) | "
                    f"{interval_text(v['eer'], 1) if v['measured'] else '-'} | "
                    f"{interval_text(v['accuracy'], 1) if v['measured'] else '-'} | " + " | ".join(kept) + " |")
        points.append((c, w))
    if not rows:
        return []
    langs = list(r["candidates"][0]["languages"])
    head = " | ".join(f"{lang} {k} gap kept %" for lang in langs for k in ("BLEU-1", "emotion-hit"))
    out = ["", "## The frontier: what each uplink reveals against what the cloud keeps", "",
           f"Targets (issue 50): rebuilt-speech STOI at most {STOI_MAX} and speaker EER at least {EER_MIN}% against "
           f"the learned attackers, while the cloud keeps at least {KEPT_MIN}% of every gap. What a view reveals is the "
           "privacy stage's (reports/privacy/privacy.md); a learned or quantised uplink's is measured here the same "
           "way on what it sends. Figure: privacy_frontier.png.", "",
           f"| representation | bytes / s | STOI (attacker) | speaker EER % | voice identified % | {head} |",
           "|---|---|---|---|---|" + "---|" * (2 * len(langs))] + rows
    met = [c["name"] for c, w in points if _meets(c, w)]
    out += ["", f"Met by: {', '.join(met)}." if met else "Met by none. " + binds_first(points)]
    return out


STOI_MAX, EER_MIN, KEPT_MIN = 0.35, 30.0, 90.0


def _meets(c: dict, w: dict) -> bool:
    return (w["stoi"]["value"] <= STOI_MAX and w["voice_id"]["measured"] and w["voice_id"]["eer"]["value"] >= EER_MIN
            and worst_kept(c) >= KEPT_MIN)


def binds_first(points: list[tuple[dict, dict]]) -> str:
    """Among the candidates that keep every gap, the most private; else, the one that keeps the most."""
    keeping = [(c, w) for c, w in points if worst_kept(c) >= KEPT_MIN]
    if keeping:
        c, w = min(keeping, key=lambda cw: cw[1]["stoi"]["value"])
        low = min(v[k]["gap_kept"]["ci_low"] for v in c["languages"].values() for k in KEYS)
        return (f"Of the candidates whose point estimates keep at least {KEPT_MIN:.0f}% of every gap (here "
                f"{label(c)}, its intervals' lowest bound {low:.1f}%), the most private rebuilds to STOI "
                f"{w['stoi']['value']:.3f} with speaker EER {w['voice_id']['eer']['value']:.1f}%: privacy binds first."
                + _private_keep(points))
    c, w = max(points, key=lambda cw: worst_kept(cw[0]))
    return (f"No candidate keeps {KEPT_MIN:.0f}% of every gap; the closest, {c['name']}, keeps {worst_kept(c):.1f}% of "
            f"its smallest (STOI {w['stoi']['value']:.3f}, speaker EER {w['voice_id']['eer']['value']:.1f}%): the "
            "cloud's quality binds first.")


def _private_keep(points: list[tuple[dict, dict]]) -> str:
    """What the candidates meeting both privacy targets keep of their smallest gap, at best."""
    private = [c for c, w in points if w["stoi"]["value"] <= STOI_MAX and w["voice_id"]["measured"]
               and w["voice_id"]["eer"]["value"] >= EER_MIN]
    if not private:
        return " No candidate meets both privacy targets."
    c = max(private, key=worst_kept)
    return (f" Of the {len(private)} that meet both privacy targets, the best keeps {worst_kept(c):.1f}% of its "
            f"smallest gap ({label(c)}).")


def plot(r: dict, path: Path) -> None:
    """STOI and speaker EER (x) against the smallest gap kept (y), per candidate; the targets' corners shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    stage = json.loads((ROOT / "reports" / "privacy" / "privacy.json").read_text())
    points = [(c, w) for c in r["candidates"] if (w := revealed(c, stage)) is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, label, value, corner in (
            (axes[0], "STOI of rebuilt speech (learned attackers)", lambda w: w["stoi"]["value"], (0, STOI_MAX)),
            (axes[1], "speaker EER %", lambda w: w["voice_id"]["eer"]["value"], (EER_MIN, 50))):
        ax.axvspan(*corner, ymin=0, ymax=1, color="tab:green", alpha=0.08)
        ax.axhline(KEPT_MIN, color="tab:green", lw=0.8, ls="--", label=f"{KEPT_MIN:.0f}% of every gap kept")
        for c, w in points:
            learned = c.get("learned") is not None
            ax.scatter(value(w), worst_kept(c), marker="*" if learned else "o", s=120 if learned else 40,
                       color="tab:red" if learned else "tab:blue")
            ax.annotate(c["candidate"], (value(w), worst_kept(c)), textcoords="offset points", xytext=(5, 3), fontsize=7)
        ax.set_xlabel(label)
    axes[1].set_xlim(0, 50)
    axes[0].set_xlim(0, 1)
    kept = [worst_kept(c) for c, _ in points]
    axes[0].set_ylim(min(kept + [0]) - 10, max(kept + [100]) + 10)
    axes[0].set_ylabel("smallest gap kept, % (of en, zh x BLEU-1, emotion hit)")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle("The privacy frontier: hand-made views (o) and learned uplinks (*); targets shaded")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merged(r: dict, old_path: Path) -> dict:
    """The report with the earlier run's candidates that this run did not make kept (nothing measured is lost)."""
    if not old_path.exists():
        return r
    old = json.loads(old_path.read_text())
    if old.get("clips_per_language") != r["clips_per_language"]:
        return r
    made = {c["candidate"] for c in r["candidates"]}
    kept = [c for c in old["candidates"] if c["candidate"] not in made]
    commands = [cmd for cmd in old.get("commands", [old.get("command")]) if cmd] + [r["command"]]
    return {**r, "commands": commands, "candidates": kept + r["candidates"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", nargs="+", default=["128x8", "8x1c", "128x8c", "16x16c"],
                    help="[bands]x[frames merged], c: clip-normalised, -q<bits>: codes of that many bits; "
                         "L[rows]x[merge][c][-a<weight>]: learned (uplink: params)")
    ap.add_argument("--clips", type=int, default=100, help="test clips per language")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "privacy_quality")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "privacy_quality")
    ap.add_argument("--render", action="store_true", help="only write the Markdown and figure again from the JSON")
    args = ap.parse_args()
    r = json.loads(args.out.with_suffix(".json").read_text()) if args.render else \
        merged(run(args.candidates, args.clips, args.work), args.out.with_suffix(".json"))
    args.out.with_suffix(".json").write_text(json.dumps(r, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(r))
    plot(r, args.out.parent / "privacy_frontier.png")
    print(markdown(r))


if __name__ == "__main__":
    main()
