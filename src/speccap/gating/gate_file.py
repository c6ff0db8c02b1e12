"""A learned token gate as one self-contained file: what the gates stage saves, the MLflow registry
logs and a device loads alone (`speccap edge --gate FILE`), with no MLflow and no pipeline code.

The file is JSON:

- `format`, `format_version`: what reads it (a reader refuses another version by name);
- `name`, `kind`, `target`: the gate (tok-<classifier>-<target>);
- `classifier`: the fitted model in its own format (LightGBM's model text; the linear and MLP
  gates' standardization and weights as numbers), gating.token_gates' scorers;
- `features`: the recipe of its input rows: the columns in order, the edge's hidden size and end
  token id (gating.features.token_rows builds them from a drafted block);
- `thresholds`: per budget rho* and language, the score above which a token is verified;
  `threshold`: the one the gate runs at by default (the promote budget's), `promote_budget`;
- `verify`: how a flagged token is verified ("alone" or with the pending ones); `verify_rank`: per
  language, the R its flagged tokens are judged by (chosen on validation by the gates stage);
- `meta`: what it was trained on; `registry`: once promoted, the registered model's name, version
  and alias.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .features import token_columns
from .token_gates import SCORERS, TokenGateModel

FORMAT = "speccap-gate"
FORMAT_VERSION = 1
SUFFIX = ".gate.json"


class GateFileError(ValueError):
    """A gate file that cannot be used, with its path and what is wrong."""


def gate_document(model: TokenGateModel, name: str, thresholds: dict, threshold: dict, promote_budget: float,
                  verify: str, verify_rank: dict | None = None) -> dict:
    """The file's content for a fitted gate and its thresholds (budget -> language -> threshold)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "kind": model.kind,
            "target": model.target, "classifier": model.scorer.to_json(),
            "features": {"columns": list(model.columns), "hidden_size": model.dim, "end_token": model.eos},
            "thresholds": thresholds, "threshold": threshold, "promote_budget": promote_budget, "verify": verify,
            "verify_rank": verify_rank, "meta": model.meta, "registry": None}


def write_gate(path: str | os.PathLike, doc: dict) -> Path:
    """Write `doc` (checked first: a file that would not load is never written)."""
    model_of(doc, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False))
    tmp.replace(path)
    return path


def read_gate(path: str | os.PathLike) -> dict:
    """The document of the gate file at `path`, checked; GateFileError names the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise GateFileError(f"{path}: no gate file there (the promote stage writes the champion's: "
                            "dvc repro promote)")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GateFileError(f"{path}: not a gate file ({exc})") from None
    model_of(doc, str(path))
    return doc


def model_of(doc: dict, where: str = "gate") -> TokenGateModel:
    """The scoring model a gate document holds; GateFileError when it is not one this code reads."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GateFileError(f"{where}: not a {FORMAT} file (its 'format' is "
                            f"{doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise GateFileError(f"{where}: format version {doc.get('format_version')!r}; this speccap reads version "
                            f"{FORMAT_VERSION} (install the speccap that wrote it, or promote the gate again)")
    try:
        clf, feats = doc["classifier"], doc["features"]
        scorer = SCORERS[clf["format"]].from_json(clf)
        model = TokenGateModel(doc["kind"], doc["target"], int(feats["hidden_size"]), int(feats["end_token"]),
                               scorer, dict(doc.get("meta") or {}))
    except KeyError as exc:
        raise GateFileError(f"{where}: lacks {exc} (a classifier format this speccap knows: {sorted(SCORERS)})") \
            from None
    if list(feats["columns"]) != list(token_columns(model.dim)):
        raise GateFileError(f"{where}: its feature columns are not the ones this speccap builds for hidden size "
                            f"{model.dim} (first difference at column "
                            f"{_first_difference(feats['columns'], token_columns(model.dim))})")
    return model


def with_registry(doc: dict, name: str, version: str, alias: str | None = None) -> dict:
    """`doc` stamped with the registered model it is (what a device reports it runs)."""
    return doc | {"registry": {"name": name, "version": str(version), "alias": alias}}


def _first_difference(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
