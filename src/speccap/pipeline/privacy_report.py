"""The privacy stage's report: what each uplink representation reveals (pipeline.privacy.measure),
as markdown and one plot."""

from __future__ import annotations

from pathlib import Path

from .markdown import interval_text, md_table
from .privacy import ATTACKERS, EER_RESAMPLES, GL_ITERS, INVERTER_CONTEXT, INVERTER_STRIDE, NETWORK_HIDDEN, SHIFT_S

STOI_TARGET = 0.3  # at most this: the words are no longer understood
# said only when a learned uplink is measured (speccap.models.learned_uplink)
LEARNED_NOTE = (f" A learned encoding (its rows are no bands: nothing to spread back) is inverted by a two-layer "
                f"network ({NETWORK_HIDDEN} units a layer) from the same inputs to the same targets, since no linear "
                "map undoes a nonlinear encoder; it is a lower bound on what a stronger attacker (a neural vocoder "
                "trained on the pairs) would rebuild.")


def target_met(wire: dict) -> bool:
    """Rebuilt speech unintelligible (STOI interval at most STOI_TARGET) and the voice named no more
    often than by always guessing the commonest one (the interval reaches that share)."""
    v = wire["voice_id"]
    return (wire["stoi"]["ci_high"] <= STOI_TARGET and v["measured"]
            and v["accuracy"]["ci_low"] <= v["majority"])


def binding(wires: list[dict]) -> str:
    """Which constraint binds, read from the table: the rebuilt speech or the voice."""
    def named(w):
        v = w["voice_id"]
        return (f"the voice named in {v['accuracy']['value']:.1f}% of clips against {v['majority']:.1f}%"
                if v["measured"] else "the voice not measured")
    quiet = [w for w in wires if w["stoi"]["ci_high"] <= STOI_TARGET]
    if quiet:
        w = min(quiet, key=lambda w: w["voice_id"]["accuracy"]["value"] if w["voice_id"]["measured"] else 100.0)
        return (f"Where the rebuilt speech is unintelligible, the voice binds: {w['name']} rebuilds to STOI "
                f"{interval_text(w['stoi'], 3)} with {named(w)}.")
    w = min(wires, key=lambda w: w["stoi"]["value"])
    return (f"No representation here rebuilds to STOI at most {STOI_TARGET}: the words bind first. The lowest, "
            f"{interval_text(w['stoi'], 3)} ({w['name']}), comes with {named(w)}.")


def _voice(v: dict) -> tuple[str, str, str]:
    if not v["measured"]:
        return "not measured", "-", "not measured"
    return f"{interval_text(v['accuracy'], 1)} ({v['voices']} voices)", f"{v['majority']:.1f}", interval_text(v["eer"], 1)


def _by_attacker(w: dict) -> list[str]:
    by = w.get("stoi_by_attacker", {})
    return [interval_text(by[a], 3) if a in by else "no bands to spread" if "learned" in w else "not measured"
            for a in ATTACKERS]


def _weaker_learner(wires: list[dict]) -> str:
    """Where the learned inverter rebuilds less than spreading back does, said (the stronger counts)."""
    weaker = [w for w in wires if len(w.get("stoi_by_attacker", {})) == 2
              and w["stoi_by_attacker"][ATTACKERS[1]]["value"] < w["stoi_by_attacker"][ATTACKERS[0]]["value"]]
    if not weaker:
        return "The learned inverter rebuilds at least as much as spreading back from every representation."
    return (f"The learned inverter rebuilds less than spreading back from {len(weaker)} of {len(wires)} "
            f"representations ({', '.join(w['name'] for w in weaker)}): fitted for the least squared error on "
            "the log-mel, it pulls every frame toward the train clips' mean and smooths the envelope STOI "
            "compares, where linear spreading keeps it. Those rows count the spread-back attacker.")


def render(r: dict) -> str:
    rows = []
    for w in r["wires"]:
        voice, majority, eer = _voice(w["voice_id"])
        # the cloud is trained on what the edge sends: its quality is the decode sweep's cloud row; a
        # candidate's needs a cloud trained on it, which the pipeline does not train
        cloud = "the cloud rows of reports/tables/quality.md" if w["sent"] else "not in the pipeline (see below)"
        rows.append([w["name"], f"{w['bytes_per_second']:.0f}", interval_text(w["stoi"], 3), *_by_attacker(w),
                     voice, majority, eer, cloud])
    table = md_table(["representation", "bytes / s of audio", "STOI of rebuilt speech (stronger attacker)",
                      f"STOI: {ATTACKERS[0]}", f"STOI: {ATTACKERS[1]}", "voice identified %", "commonest voice %",
                      "speaker EER %", "the cloud's quality from it"], rows)
    met = [w["name"] for w in r["wires"] if target_met(w)]
    verdict = (f"met by {', '.join(met)} (the cloud's quality from it is not measured here)." if met
               else f"met by none. {binding(r['wires'])}")
    stated = r.get("named_by_the_caption", {"measured": False})
    if stated["measured"]:
        verdict += (f" The captions themselves bound how far the voice can hide: they state the speaker's gender "
                    f"and spoken language, and knowing only those names the voice in {stated['accuracy']:.1f}% of "
                    "test clips (the commonest voice of each pair). An uplink from which the cloud writes correct "
                    "captions carries both, so the voice near chance and the cloud's quality cannot both be met "
                    "on this corpus.")
    return "\n".join([
        "# What the uplink reveals about the speech", "",
        f"Written by the `privacy` stage on {r['clips']} test clips ({', '.join(r['languages'])}); 95% bootstrap "
        "intervals over clips. Each representation is what `uplink:` params would make the edge send (the "
        "log-mel's bands pooled, frames merged, each band's clip level and spread removed: speccap.data.uplink).", "",
        "Speech rebuilt from it, scored by STOI (near 0.8 the words are understood), by two attackers; the stronger "
        f"counts. *{ATTACKERS[0]}* learns nothing but the train clips' typical band levels: pooled values spread "
        f"back over their bands and frames. *{ATTACKERS[1]}* learns to invert the representation: a ridge map, "
        f"fitted on {r.get('inverter_train_clips', 0)} train clips' (representation, log-mel) pairs, from the "
        f"spread-back representation {INVERTER_CONTEXT} frame(s) either side ({INVERTER_STRIDE} frames apart) to each "
        f"frame's log-mel. Both end in mel inversion and Griffin-Lim ({GL_ITERS} iterations). Floor: a clip against "
        f"itself {SHIFT_S} s late, STOI {interval_text(r['floor'], 3)}."
        + (LEARNED_NOTE if any("learned" in w for w in r["wires"]) else ""), "",
        "Who is speaking, by classifiers retrained on each representation of the train clips (the stronger of two "
        "logistic regressions: one on each clip's per-band level, spread, movement and percentiles, one on single "
        "frames averaged over the clip), tested on every test clip: the voice named, against always naming the "
        "commonest voice; and speaker verification, every pair of test clips judged same voice or not by the cosine "
        "of their square-root posteriors, as the equal error rate (50% is chance; its interval resamples clips, "
        f"{EER_RESAMPLES} times).", "",
        "The cloud's quality from what the edge sends is the decode sweep's cloud row (the `train` stage trains the "
        "cloud on it); from another candidate it needs a cloud trained on that one, which the pipeline does not "
        "train: benchmarks/privacy_quality.py does, for some candidates (reports/privacy_quality.md).", "",
        table, "",
        _weaker_learner(r["wires"]), "",
        f"Target (rebuilt-speech STOI at most {STOI_TARGET} against the stronger attacker, the voice named no more "
        f"often than the commonest voice's share): {verdict}", "",
        "![STOI of rebuilt speech against voice identification, per representation](privacy.png)", ""])


def _short(w: dict) -> str:
    """A point's label: bands x frames merged, n for clip-normalised (the table has the full names)."""
    label = ("L" if "learned" in w else "") + f"{w['rows']}x{w['merge']}" + (" n" if w["normalize"] == "clip" else "")
    return label + (" (sent)" if w["sent"] else "")


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
    stated = r.get("named_by_the_caption", {"measured": False})
    if stated["measured"]:
        ax.axhline(stated["accuracy"], color="tab:orange", lw=0.8, ls="-.",
                   label=f"told only the caption's gender and language ({stated['accuracy']:.0f}%)")
    ax.axvline(r["floor"]["value"], color="grey", lw=0.8, ls="--", label="STOI floor (the clip 0.2 s late)")
    for w in measured:
        s, a = w["stoi"], w["voice_id"]["accuracy"]
        ax.errorbar(s["value"], a["value"], xerr=[[s["value"] - s["ci_low"]], [s["ci_high"] - s["value"]]],
                    yerr=[[a["value"] - a["ci_low"]], [a["ci_high"] - a["value"]]], fmt="o" if not w["sent"] else "*",
                    ms=7 if not w["sent"] else 13, color="tab:red" if w["sent"] else "tab:blue", capsize=2)
        ax.annotate(_short(w), (s["value"], a["value"]), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 100)
    ax.set_xlabel("STOI of speech rebuilt from the wire (near 0.8: words understood)")
    ax.set_ylabel("voice identified from the wire, % of test clips")
    ax.set_title("What the uplink reveals: bands x frames merged (n: clip-normalised)")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
