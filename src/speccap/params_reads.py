"""Which params a process reads, recorded as it runs: the evidence behind each stage's params in dvc.yaml.

With $SPECCAP_RECORD_PARAMS set to a folder, every read of a params field (a leaf, by its dotted key,
e.g. `decode.temperature`) is appended to <folder>/<$SPECCAP_STAGE>.txt, once per process; a stage's
worker processes inherit both variables and write to the same file. stage_params.uncovered() holds
the records against STAGE_PARAMS. Unset (always, outside that check), nothing is patched.

How a read gets its key: a `Params` object is the root; an attribute read from an object whose key
is known gives its value that key plus the field's name. Objects that arrive some other way (a
section unpickled in a worker) are keyed by their class, at every place the schema holds it; a
`dataclasses.replace()` copy keeps the keys of the fields it copied. Reads made by the code in
NOT_RESULTS, at any depth below it, are not recorded.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import traceback
import typing
from pathlib import Path

from . import params_schema

RECORD_ENV = "SPECCAP_RECORD_PARAMS"
WHY_ENV = "SPECCAP_RECORD_WHY"  # comma-separated keys: where each is first read goes to <stage>.why
STAGE_ENV = "SPECCAP_STAGE"
# Code a stage runs on purpose without its outputs depending on it: its reads of params are not the
# stage's params, and its code (with what it imports for its own sake) is not among the stage's code
# deps (scripts/stage_deps.py). One place, with the reason.
NOT_RESULTS = {
    "speccap.tracking": "MLflow logging: where results are recorded, not what they are",
    "speccap.preflight": "checks a stage's inputs before it starts and stops it; writes nothing",
    "speccap.numba_cache": "where numba keeps its compiled cache, not what it computes",
    "speccap.params_reads": "records which params a stage reads (its own reads, replace()'s copying included)",
}
# functions whose reads of params are not results either: a cache key, under which a changed value
# only means the stage recomputes what it would otherwise reuse
NOT_RESULT_READERS = {
    "speccap.pipeline.sweep.config_key": "the key of a configuration's cached records",
    "speccap.config._validate": "cross-field checks on load: a bad value stops every stage, it shapes no output",
}
_DEPTH = 12  # frames looked at above a read for a caller in NOT_RESULTS


def _classes() -> dict[type, list[str]]:
    """Each params class -> the dotted prefixes at which the schema holds it."""
    out: dict[type, list[str]] = {}

    def walk(cls: type, prefix: str) -> None:
        out.setdefault(cls, []).append(prefix)
        for name, hint in typing.get_type_hints(cls).items():
            if isinstance(hint, type) and dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{name}.")
    walk(params_schema.Params, "")
    return out


class Recorder:
    """Appends each dotted key the first time this process reads it."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.prefixes = _classes()
        # id -> (the object, kept alive so its id is not reused; field -> key prefix, or one prefix for all)
        self.known: dict[int, tuple[object, str | dict[str, str | None]]] = {}
        self.why = set(filter(None, os.environ.get(WHY_ENV, "").split(",")))

    def prefix(self, obj: object, name: str) -> list[str]:
        entry = self.known.get(id(obj))
        if type(obj) is params_schema.Params:
            return [""]
        if entry is None or entry[0] is not obj:
            return self.prefixes.get(type(obj), [])
        keys = entry[1]
        if isinstance(keys, str):
            return [keys]
        return [keys[name]] if keys.get(name) is not None else []

    def read(self, obj: object, name: str, value: object) -> None:
        if _from_not_result(sys._getframe(2)):
            return
        prefixes = self.prefix(obj, name)
        if type(value) in self.prefixes:  # a section: its own reads are what count
            if len(prefixes) == 1:
                self.known[id(value)] = (value, f"{prefixes[0]}{name}.")
            return
        for p in prefixes:
            self.write(f"{p}{name}")

    def copied(self, old: object, new: object, changes: dict) -> None:
        """`new` = replace(old, **changes): the fields it copied keep old's keys; the changed ones are
        the caller's, recorded where the caller read them."""
        keys = {}
        for f in dataclasses.fields(old):
            if f.name not in changes:
                found = self.prefix(old, f.name)
                keys[f.name] = found[0] if len(found) == 1 else None
        self.known[id(new)] = (new, keys)

    def write(self, key: str) -> None:
        with self.lock:
            if key in self.seen:
                return
            self.seen.add(key)
            self.folder.mkdir(parents=True, exist_ok=True)
            stage = os.environ.get(STAGE_ENV, "unknown")
            with open(self.folder / f"{stage}.txt", "a", encoding="utf-8") as fh:
                fh.write(key + "\n")
            if key in self.why:
                with open(self.folder / f"{stage}.why", "a", encoding="utf-8") as fh:
                    fh.write(f"{key}:\n{''.join(traceback.format_stack()[:-3])}\n")


def _from_not_result(frame) -> bool:
    for _ in range(_DEPTH):
        if frame is None:
            return False
        module = frame.f_globals.get("__name__", "")
        if module in NOT_RESULTS or f"{module}.{frame.f_code.co_qualname}" in NOT_RESULT_READERS:
            return True
        frame = frame.f_back
    return False


_recorder: Recorder | None = None
_replace = dataclasses.replace


def _recording_replace(obj, /, **changes):
    new = _replace(obj, **changes)
    if _recorder is not None and type(obj) in _recorder.prefixes:
        _recorder.copied(obj, new, changes)
    return new


def _getattribute(self, name):
    value = object.__getattribute__(self, name)
    if _recorder is not None and name in type(self).__dataclass_fields__ and not getattr(_LOCAL, "busy", False):
        _LOCAL.busy = True
        try:
            _recorder.read(self, name, value)
        finally:
            _LOCAL.busy = False
    return value


_LOCAL = threading.local()


def install(folder: str | os.PathLike) -> Recorder:
    """Record from now on, into `folder` (every params class patched, dataclasses.replace wrapped)."""
    global _recorder
    _recorder = Recorder(folder)
    for cls in _recorder.prefixes:
        cls.__getattribute__ = _getattribute
    dataclasses.replace = _recording_replace
    return _recorder


def install_from_env() -> Recorder | None:
    folder = os.environ.get(RECORD_ENV)
    return install(folder) if folder and _recorder is None else None


def recorded(folder: str | os.PathLike) -> dict[str, set[str]]:
    """stage -> the keys its processes read, from a folder of records."""
    return {p.stem: set(p.read_text(encoding="utf-8").split()) for p in sorted(Path(folder).glob("*.txt"))}
