"""How separable the corpus's emotions are: in principle (from the cue values each clip was rendered
with) and to the ear of a simple listener (from clip-level statistics of the features the models
get: the prosody vector and each mel band's mean and standard deviation).

The first says whether the corpus could be captioned perfectly; the second is a floor for what an
audio encoder can hear, and the emotion-hit rates of edge and cloud (reports/tables/quality.md) sit
against it. Both are LightGBM classifiers trained on the train split and scored on the test split,
per speech language. Once the captioners are trained, a third column per captioner: what its audio
side carries, a linear probe (logistic regression) on the text model's input at the audio
positions, averaged over the clip's two halves (what the training's emotion probe reads): how much
emotion its audio side carries, read linearly, beside how often its caption names the right one.
Run after `dvc repro featurize` (or a whole repro):

    python benchmarks/separability.py          # -> reports/separability.md, reports/separability.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from speccap.config import load_params  # noqa: E402
from speccap.data.emotions import EMOTIONS  # noqa: E402
from speccap.data.featurize import load_clip_features  # noqa: E402
from speccap.data.manifest import manifest_path, read_manifest  # noqa: E402

CUE_KEYS = ("pitch", "pitch_range", "rate", "volume", "tremor", "breathiness", "harshness", "pauses")
CONTOURS = ("steady", "rising", "falling")


def cue_row(cues: dict) -> list[float]:
    return [float(cues[k]) for k in CUE_KEYS] + [CONTOURS.index(cues["contour"]), cues["gender"] == "male"]


def load(params, split: str, language: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(true-cue rows, feature-statistics rows, emotion labels) of one split's clips in `language`."""
    cues, feats, labels = [], [], []
    for rec in read_manifest(manifest_path(params.data.processed_dir, split, language)):
        mel, prosody = load_clip_features(params.data.processed_dir, rec["id"])
        cues.append(cue_row(rec["cues"]))
        feats.append(np.concatenate([prosody, mel.mean(1), mel.std(1)]))
        labels.append(EMOTIONS.index(rec["emotion"]))
    return np.array(cues, float), np.array(feats, float), np.array(labels)


def audio_side(params, role: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """split -> (rows, emotion labels, speech languages) of the train and test clips: a trained
    captioner's text-model input at the audio positions, averaged over the clip's two halves.
    The model is loaded once and each split's examples are read once, for all languages."""
    import torch

    from speccap.models.aux_targets import span_means
    from speccap.models.captioners import load_examples
    from speccap.models.loading import load_role
    from speccap.models.train import make_batch
    lm = load_role(params, role)
    lm.model.eval()
    out = {}
    for split in ("train", "test"):
        examples = load_examples(params, split, lm.tokenizer)
        rows = []
        for i in range(0, len(examples), 32):
            chunk = examples[i: i + 32]
            batch = make_batch(lm, chunk, [0] * len(chunk))
            with torch.no_grad():
                hidden = lm.model(input_ids=batch["input_ids"], input_features=batch["input_features"],
                                  feature_attention_mask=batch["feature_attention_mask"],
                                  attention_mask=batch["attention_mask"], output_hidden_states=True,
                                  use_cache=False).hidden_states[0]
            rows.append(span_means(hidden, (batch["input_ids"] == lm.audio_id).float(), 2).float().numpy())
        out[split] = (np.concatenate(rows), np.array([e.emotion for e in examples]),
                      np.array([e.language for e in examples]))
    return out


def probe_accuracy(train_x, train_y, test_x, test_y) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))
    return float((model.fit(train_x, train_y).predict(test_x) == test_y).mean())


def accuracy(train_x, train_y, test_x, test_y, seed: int) -> tuple[float, np.ndarray]:
    import lightgbm as lgb
    model = lgb.LGBMClassifier(n_estimators=400, learning_rate=0.05, random_state=seed, n_jobs=1, verbose=-1)
    pred = model.fit(train_x, train_y).predict(test_x)
    confusion = np.zeros((len(EMOTIONS), len(EMOTIONS)), int)
    np.add.at(confusion, (test_y, pred), 1)
    return float((pred == test_y).mean()), confusion


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default=None)
    ap.add_argument("--out", default=str(ROOT / "reports"))
    args = ap.parse_args()
    params = load_params(args.params)
    result = {"languages": {}}
    for lang in params.data.languages:
        tr_c, tr_f, tr_y = load(params, "train", lang)
        te_c, te_f, te_y = load(params, "test", lang)
        if not len(tr_y) or not len(te_y):
            raise SystemExit(f"no {lang} train or test clips under {params.data.processed_dir}: run the featurize stage")
        cue_acc, _ = accuracy(tr_c, tr_y, te_c, te_y, params.seed)
        ear_acc, confusion = accuracy(tr_f, tr_y, te_f, te_y, params.seed)
        result["languages"][lang] = {"train_clips": int(len(tr_y)), "test_clips": int(len(te_y)),
                                     "true_cues": cue_acc, "feature_statistics": ear_acc,
                                     "confusion": confusion.tolist()}
    for role in ("edge", "cloud"):
        if not (Path(params.models.dir) / role / "config.json").exists():
            continue  # not trained yet: the report says so
        side = audio_side(params, role)
        for lang, r in result["languages"].items():
            (tr_x, tr_y, tr_l), (te_x, te_y, te_l) = side["train"], side["test"]
            r[f"{role}_audio_probe"] = probe_accuracy(tr_x[tr_l == lang], tr_y[tr_l == lang],
                                                      te_x[te_l == lang], te_y[te_l == lang])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "separability.json").write_text(json.dumps(result, indent=1))
    lines = ["# How separable the corpus's emotions are\n",
             f"Made by `python benchmarks/separability.py` (cue spread {params.data.synthetic.cue_spread:g}). "
             "LightGBM trained on the train split, accuracy on the test split (7 emotions, chance about 14%): from "
             "the cue values each clip was rendered with (in principle), and from clip-level statistics of the "
             "features the models get (prosody vector, mean and standard deviation of each mel band: a floor "
             "for what an audio encoder can hear). Then, per trained captioner, a linear probe (logistic "
             "regression) on its text model's input at the audio positions, averaged over the clip's two halves: "
             "what its audio side carries, read linearly, beside what its caption names (reports/tables/quality.md).\n",
             "| speech language | train / test clips | from the true cues | from feature statistics | "
             "edge's audio side | cloud's audio side |",
             "|---|---|---|---|---|---|"]
    probe = lambda r, role: f"{100 * r[role]:.1f}%" if role in r else "not trained"  # noqa: E731
    for lang, r in result["languages"].items():
        lines.append(f"| {lang} | {r['train_clips']} / {r['test_clips']} | {100 * r['true_cues']:.1f}% | "
                     f"{100 * r['feature_statistics']:.1f}% | {probe(r, 'edge_audio_probe')} | "
                     f"{probe(r, 'cloud_audio_probe')} |")
    for lang, r in result["languages"].items():
        lines += [f"\n## Confusions from feature statistics, {lang} (rows: true emotion)\n",
                  "| | " + " | ".join(EMOTIONS) + " |", "|---" * (len(EMOTIONS) + 1) + "|"]
        lines += [f"| {e} | " + " | ".join(str(v) for v in row) + " |" for e, row in zip(EMOTIONS, r["confusion"])]
    (out / "separability.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6 + len(result["languages"])]))


if __name__ == "__main__":
    main()
