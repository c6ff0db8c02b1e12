"""Worker processes that hold the models, and the job they run most: one caption of one sweep
configuration. Each process loads the edge and cloud once (the pool's initializer, or
`ensure_models` on a Dask worker) and keeps a cache of the learned deciders its decoders load.

A job function takes the models as its first argument, a `Worker`, and one job: `fn(worker, job)`
(caption_one here, the trace jobs in pipeline.traces). With `batch` > 1 a worker takes jobs in
chunks and runs a chunk's jobs together through the batching executor (batching.lockstep): the
`Worker` they are given then holds the executor's stepped models, so each job function decodes
batched without knowing it."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice

import numpy as np

from ..batching.lockstep import Lockstep, decode_all
from ..batching.row_pool import batchable
from ..batching.step_graphs import Invariant
from ..config import Params, load_params
from ..data.featurize import KeptMels
from ..decoding.build import build_decoder
from ..decoding.cost import CostModel
from ..decoding.engine import cloud_only, edge_only, speculative
from ..decoding.link import Link
from ..decoding.relink import link_log
from ..fanout import WorkerPool
from ..metrics.system import ResourceMonitor
from ..models.thinker import AudioCache, PromptCache, ThinkerLM
from .saved import cached_head, load_gate
from .sweep import RunConfig, link_config, models_fingerprint, relinkable

# MiB of clips' log-mels a worker keeps (KeptMels): every test clip of the embedded corpus, a few
# hundred of MER2024's
KEPT_MELS_MB = 128
# what this process loaded (the initializer's or ensure_models' Worker, with its key and count)
# and the batching executors made over it; set when loading, never swapped for a job
_PROCESS: dict = {}


@dataclass(frozen=True)
class Worker:
    """What a worker process loaded once: the params, both models, a cache of the learned
    deciders its decoders load (gates, the WISV head) and the clips' log-mels its jobs read
    (`mel`); `scoring` wraps a gate's model as it is loaded (the batching executor's:
    Lockstep.scorer)."""
    params: Params
    edge: object
    cloud: object
    cache: dict
    mels: KeptMels
    scoring: Callable | None = None

    def mel(self, clip_id: str) -> np.ndarray:
        """The clip's log-mel (float32 (n_mels, frames); shared, see KeptMels)."""
        return self.mels.get(clip_id)


def worker() -> Worker:
    """This worker process's models (loaded by the pool's initializer or `ensure_models`)."""
    if "worker" not in _PROCESS:
        raise RuntimeError("no models loaded in this process (a Pool's initializer or ensure_models loads them)")
    return _PROCESS["worker"]


def stepped(batch: int) -> tuple[Lockstep, Worker]:
    """A batching executor of `batch` rows and this process's models behind it (made once per size)."""
    w = worker()
    key = (batch, id(w.edge), id(w.cloud))
    if key not in _PROCESS.setdefault("stepped", {}):
        ex = Lockstep(batch, invariant=invariance(w.params, (w.edge, w.cloud)))
        # its own cache: the gates it loads score through it
        _PROCESS["stepped"][key] = ex, replace(w, edge=ex.wrap(w.edge), cloud=ex.wrap(w.cloud), cache={},
                                               scoring=ex.scorer)
    return _PROCESS["stepped"][key]


def invariance(params: Params, models) -> Invariant | None:
    """`sweep.invariant_rows` as the executor's setting (None: off): its rows, and room in each for the
    longest prompt a clip of data.max_clip_seconds makes for any of `models` and a caption of
    models.max_new_tokens."""
    rows = params.sweep.invariant_rows
    thinkers = [lm for lm in models if batchable(lm)]
    if not rows or not thinkers:
        return None
    f = params.features
    frames = math.ceil(params.data.max_clip_seconds * f.sample_rate / f.hop_length) + 1
    longest = max(len(lm.prompt_ids(frames, lang)) for lm in thinkers for lang in params.data.languages)
    return Invariant.covering(rows, longest, params.models.max_new_tokens)


def through_executor(params: Params) -> bool:
    """Whether a stage's jobs run through the batching executor: batched, or batch-invariant (a
    caption alone then steps at the setting's shape too, as it would in a batch)."""
    return params.sweep.batch > 1 or params.sweep.invariant_rows > 0


def _init_worker(params_path: str | None, threads: int) -> None:
    import torch

    from ..models.base import shared_vocab
    from ..models.loading import load_role
    torch.set_num_threads(threads)
    params = load_params(params_path)
    edge, cloud = load_role(params, "edge"), load_role(params, "cloud")
    shared_vocab(edge, cloud)
    keep_prompts(params, (edge, cloud))
    _PROCESS.update(worker=Worker(params, edge, cloud, {}, KeptMels(params.data.processed_dir, KEPT_MELS_MB * 2**20)),
                    stepped={})


def keep_prompts(params: Params, models) -> None:
    """`sweep.prompt_cache_mb` of prompts and `sweep.audio_cache_mb` of audio encodings kept per
    thinker of `models` (each off at 0)."""
    mib = 2**20
    for lm in models:
        if isinstance(lm, ThinkerLM):
            lm.prompts = PromptCache(params.sweep.prompt_cache_mb * mib) if params.sweep.prompt_cache_mb else None
            lm.audio = AudioCache(params.sweep.audio_cache_mb * mib) if params.sweep.audio_cache_mb else None


def learned_gates(w: Worker):
    """How the decoders of worker `w` load learned gates: from models/gates/, each file read and
    its model built once, then wrapped by `w.scoring`."""
    return lambda spec: load_gate(w.params, spec.gate, spec.threshold, cache=w.cache.setdefault("gates", {}),
                                  fold=spec.fold, through=w.scoring)


def caption_one(w: Worker, job: tuple[RunConfig, str]) -> dict:
    """Caption one clip under one configuration with `w`'s models; errors become records, not crashes."""
    cfg, clip_id = job
    params = w.params
    try:
        mel = w.mel(clip_id)
        max_new = params.models.max_new_tokens
        link = Link(link_config(params, cfg), seed=params.seed)
        if cfg.method == "edge":
            rec = edge_only(w.edge, mel, cfg.language, max_new, params.decode.temperature, params.seed,
                            params.decode.edge_time_scale, CostModel.from_params(params.decode.cost))
        elif cfg.method == "cloud":
            rec = cloud_only(w.cloud, mel, cfg.language, link, max_new, params.decode.temperature, params.seed,
                             params.decode.cloud_time_scale, CostModel.from_params(params.decode.cost))
        else:
            settings = build_decoder(cfg.spec, learned=learned_gates(w),
                                     head=cached_head(params, w.cache) if cfg.spec.rule == "wisv" else None,
                                     link=link, vocab=w.edge.vocab_size)
            rec = speculative(w.edge, w.cloud, mel, cfg.language, settings, link)
            if relinkable(cfg):
                return {"id": clip_id, "caption": rec.caption, **rec.metrics(), "link_log": link_log(rec.packets)}
        return {"id": clip_id, "caption": rec.caption, **rec.metrics()}
    except Exception as exc:  # noqa: BLE001 - recorded per caption; the configuration decides
        return {"id": clip_id, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def ensure_models(params_path: str | None, threads: int) -> int:
    """Load the models into this process unless the same ones are loaded already: a Dask worker
    runs many configurations and keeps its models between them (reloaded when the params file or
    the weights change). Returns how often this process has loaded models."""
    key = (str(params_path), models_fingerprint(load_params(params_path)), threads)
    if _PROCESS.get("key") != key:
        _init_worker(params_path, threads)
        _PROCESS.update(key=key, loads=_PROCESS.get("loads", 0) + 1)
    return _PROCESS["loads"]


def run_one(fn: Callable, job) -> dict:
    """fn(worker, job) with this process's models."""
    return fn(worker(), job)


def run_chunk(fn: Callable, batch: int, chunk: list) -> list:
    """fn(worker, job) for every job of `chunk` (at most `batch`), all at once through this process's
    batching executor; returns the results as the jobs end. Where there is a GPU, each result that is a
    record also gets the batch's GPU figures (`batch_gpu_percent`, ...): its own span's are the batches
    it ran in, this is the one it belonged to."""
    ex, w = stepped(batch)
    with ResourceMonitor() as mon:
        results = list(ex.map(partial(fn, w), chunk))
    gpu = {f"batch_{k}": v for k, v in mon.gpu_summary().items()}  # nothing without a GPU
    return [r | gpu if gpu and isinstance(r, dict) and "caption" in r else r for r in results]


def chunked(jobs: Iterable, size: int) -> Iterator[list]:
    it = iter(jobs)
    while chunk := list(islice(it, size)):
        yield chunk


def chunk_name(chunk: list) -> str:
    more = f" and {len(chunk) - 1} more decoded with it" if len(chunk) > 1 else ""
    return job_name(chunk[0]) + more


# decode(fn, jobs) -> [fn(edge, cloud, job) for job in jobs], on models a stage holds in its own process
Decode = Callable[[Callable, list], list]


def in_process(params: Params, edge, cloud) -> Decode:
    """`Decode` over `edge` and `cloud` held in this process, `sweep.batch` jobs at once (as a stage's
    worker pool runs them: Pool.for_stage)."""
    return partial(decode_all, edge, cloud, batch=params.sweep.batch, invariant=invariance(params, (edge, cloud)))


class Loaded:
    """A Pool-like runner over the models `ensure_models` loaded in this process (`batch` jobs at once
    through the batching executor when `lockstep`, as `through_executor` says)."""

    def __init__(self, fn=None, batch: int = 1, lockstep: bool | None = None):
        self.fn = fn or caption_one
        self.batch = batch
        self.lockstep = batch > 1 if lockstep is None else lockstep

    @classmethod
    def as_loaded(cls, fn=None) -> Loaded:
        """Over this process's models, `sweep.batch` jobs at once as the params they were loaded
        with say (a Dask worker's: flows.cluster)."""
        params = worker().params
        return cls(fn, params.sweep.batch, through_executor(params))

    def imap(self, jobs):
        if not self.lockstep:
            return map(partial(run_one, self.fn), jobs)
        return (out for chunk in chunked(jobs, self.batch) for out in run_chunk(self.fn, self.batch, chunk))

    def close(self):
        pass


def job_name(job: tuple) -> str:
    """What a worker holds, for error messages: a caption job (configuration, clip id) or a trace job
    (clip id, split, language, ...)."""
    if isinstance(job[0], RunConfig):
        return f"clip {job[1]} of {job[0].name}"
    return f"clip {job[0]} ({job[2]}, {job[1]} split)"


class Pool:
    """Worker processes holding the models; `workers=0` runs in this process (tests, debugging).
    `fn` is the job function (module-level, `fn(worker, job)`); with
    `lockstep` (default: `batch` > 1) each worker runs `batch` jobs at once through its batching
    executor (run_chunk). A worker that dies raises `WorkerDied` from `imap` (speccap.fanout): the
    records written so far stay."""

    def __init__(self, params_path: str | None, workers: int, threads: int, fn=None, stage: str = "decode",
                 batch: int = 1, lockstep: bool | None = None):
        self.workers, self.batch = workers, batch
        self.lockstep = batch > 1 if lockstep is None else lockstep
        self.fn = fn or caption_one
        job = partial(run_chunk, self.fn, batch) if self.lockstep else partial(run_one, self.fn)
        self.pool = WorkerPool(job, workers, stage=stage, initializer=_init_worker, initargs=(params_path, threads))

    @classmethod
    def for_stage(cls, params: Params, params_path: str | None, stage: str, fn=None,
                  workers: int | None = None) -> Pool:
        """A stage's pool as params set it: `sweep.workers` processes (or `workers`) of
        `sweep.threads` threads, each running `sweep.batch` captions at once."""
        sw = params.sweep
        return cls(params_path, sw.workers if workers is None else workers, sw.threads, fn, stage, sw.batch,
                   through_executor(params))

    def imap(self, jobs):
        if not self.lockstep:
            return self.pool.imap_unordered(jobs, key=job_name)
        done = self.pool.imap_unordered(chunked(jobs, self.batch), key=chunk_name)
        return (out for outs in done for out in outs)

    def close(self):
        self.pool.close()
