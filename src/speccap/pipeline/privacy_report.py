"""The privacy stage's report: what each uplink representation reveals (pipeline.privacy.measure),
as markdown and one plot."""

from __future__ import annotations

from pathlib import Path

from .markdown import interval_text, md_table
from .privacy import GL_ITERS, SHIFT_S

STOI_TARGET = 0.3  # at most this: the words are no longer understood


def target_met(wire: dict) -> bool:
    """Rebuilt speech unintelligible (STOI interval at most STOI_TARGET) and the voice named no more
    often than by always guessing the commonest one (the interval reaches that share)."""
    v = wire["voice_id"]
    return (wire["stoi"]["ci_high"] <= STOI_TARGET and v["measured"]
            and v["accuracy"]["ci_low"] <= v["majority"])


def _voice(v: dict) -> tuple[str, str]:
    if not v["measured"]:
        return "not measured", "-"
    return f"{interval_text(v['accuracy'], 1)} ({v['voices']} voices)", f"{v['majority']:.1f}"


def render(r: dict) -> str:
    rows = []
    for w in r["wires"]:
        voice, majority = _voice(w["voice_id"])
        # the log-mel is the cloud's own input: its quality is the decode sweep's cloud row, all of the
        # edge-to-cloud gap; a candidate's needs a cloud trained on it, which the pipeline does not train
        cloud = "the cloud rows of reports/tables/quality.md" if w["sent"] else "not in the pipeline (see below)"
        rows.append([w["name"], f"{w['bytes_per_second']:.0f}", interval_text(w["stoi"], 3), voice, majority, cloud])
    table = md_table(["representation", "bytes / s of audio", "STOI of rebuilt speech", "voice identified %",
                      "commonest voice %", "the cloud's quality from it"], rows)
    best = min(r["wires"], key=lambda w: w["stoi"]["value"])
    met = [w["name"] for w in r["wires"] if target_met(w)]
    if met:
        verdict = f"met by {', '.join(met)} (the cloud's quality from it is not measured)."
    else:
        bv = best["voice_id"]
        named = (f"still leaves the voice identified in {bv['accuracy']['value']:.1f}% of clips against "
                 f"{bv['majority']:.1f}%" if bv["measured"] else "leaves the voice unmeasured")
        verdict = (f"met by none. The lowest STOI, {interval_text(best['stoi'], 3)} ({best['name']}), {named}. What binds "
                   "is the voice: a coarser log-mel hides the words sooner than the voice, whose spectral balance "
                   "survives in a few bands averaged over a clip (read from the table, not a measured cause).")
    return "\n".join([
        "# What the uplink reveals about the speech", "",
        f"Written by the `privacy` stage on {r['clips']} test clips ({', '.join(r['languages'])}); 95% bootstrap "
        "intervals over clips. STOI of speech rebuilt from each representation by an attacker who learns nothing "
        f"(mel inversion + Griffin-Lim, {GL_ITERS} iterations); near 0.8 the words are understood. Floor: a clip "
        f"against itself {SHIFT_S} s late, STOI {interval_text(r['floor'], 3)}. Voice identification: logistic regression on "
        "each clip's per-band mean and spread, trained on train clips, tested on every test clip, against always "
        "naming the commonest voice. The cloud's quality from the log-mel, its own input, is the decode sweep's "
        "cloud row (all of the edge-to-cloud gap); from a candidate it needs a cloud trained on that input, which "
        "the pipeline does not train: benchmarks/privacy_quality.py does, for some candidates "
        "(reports/privacy_quality.md).", "",
        table, "",
        f"Target (rebuilt-speech STOI at most {STOI_TARGET}, the voice named no more often than the commonest "
        f"voice's share): {verdict}", "",
        "![STOI of rebuilt speech against voice identification, per representation](privacy.png)", ""])


def plot(r: dict, path: str | Path) -> None:
    """Each representation as a point: what an attacker understands (STOI, x) against how often it
    names the voice (y), with intervals; the target corner shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 5))
    measured = [w for w in r["wires"] if w["voice_id"]["measured"]]
    majority = max((w["voice_id"]["majority"] for w in measured), default=None)
    if majority is not None:
        ax.axhspan(0, majority, xmin=0, xmax=STOI_TARGET, color="tab:green", alpha=0.12,
                   label="target: STOI ≤ 0.3, voice at the commonest share")
        ax.axhline(majority, color="grey", lw=0.8, ls=":", label=f"always the commonest voice ({majority:.0f}%)")
    ax.axvline(r["floor"]["value"], color="grey", lw=0.8, ls="--", label="STOI floor (the clip 0.2 s late)")
    for w in measured:
        s, a = w["stoi"], w["voice_id"]["accuracy"]
        ax.errorbar(s["value"], a["value"], xerr=[[s["value"] - s["ci_low"]], [s["ci_high"] - s["value"]]],
                    yerr=[[a["value"] - a["ci_low"]], [a["ci_high"] - a["value"]]], fmt="o" if not w["sent"] else "*",
                    ms=7 if not w["sent"] else 13, color="tab:red" if w["sent"] else "tab:blue", capsize=2)
        label = w["name"].replace("log-mel ", "").replace(" (what the edge sends)", ", sent today")
        # labels of the right-hand points go to their left (the crowded corner); today's, right and below
        left = s["value"] > 0.55 and not w["sent"]
        ax.annotate(f"{label}\n{w['bytes_per_second']:.0f} B/s", (s["value"], a["value"]), textcoords="offset points",
                    xytext=(-8 if left else 8, -24 if w["sent"] else 4), ha="right" if left else "left", fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 100)
    ax.set_xlabel("STOI of speech rebuilt from the wire (near 0.8: words understood)")
    ax.set_ylabel("voice identified from the wire, % of test clips")
    ax.set_title("What the uplink reveals, per representation")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
