"""Many sequences through a Qwen2.5-Omni thinker's text decoder in one forward.

Speculative decoding asks a model for 1 to 8 tokens at a time. Alone, such a forward reads all of
the model's weights to produce a handful of logits, and on a GPU the card idles; packed, B sequences
share that read. `BatchedStep` is `fast_step.FastStep`'s arithmetic over a batch:

- one KV cache for B rows (`BatchedCache`: per layer a (B, kv_heads, capacity, head_dim) tensor for
  keys and one for values) and a length per row. A row's cached tokens always fill its slots
  0 .. length-1, so a rollback is that row's length going down (the slots it leaves are overwritten
  by the row's next tokens), and the rows need never agree on a length;
- ragged requests: row b asks for counts[b] new tokens (0: the row sits this step out), padded to the
  longest; padding writes keys beyond the row's length, where no query looks;
- each query sees its row's slots up to its own position (the boolean mask of SDPA), at rotary
  position `length + j + rope_delta[b]` (text tokens after the audio: the three M-RoPE rows equal).

Rows start from a single-sequence prefill (`load_row`, from `ThinkerSession`'s cache) so the audio
prompt goes through HF's forward as it does alone. tests/models/test_batched_step.py holds every
row to the single-sequence step it replaces.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..models.fast_step import FastStep


class BatchedCache:
    """Keys and values of `rows` sequences, `capacity` slots each, on `model`'s device and dtype."""

    def __init__(self, step: FastStep, rows: int, capacity: int):
        shape = (rows, step.kv_heads, capacity, step.head_dim)
        w = step.embed
        self.keys = [torch.zeros(shape, device=w.device, dtype=w.dtype) for _ in step.layers]
        self.values = [torch.zeros(shape, device=w.device, dtype=w.dtype) for _ in step.layers]
        self.lengths = torch.zeros(rows, dtype=torch.long, device=w.device)
        self.rope_delta = torch.zeros(rows, dtype=torch.long, device=w.device)
        self.capacity = capacity

    @property
    def rows(self) -> int:
        return self.lengths.shape[0]

    def load_row(self, row: int, cache, rope_delta: int = 0, source: int = 0, length: int | None = None) -> None:
        """Row `row` becomes a copy of the first `length` positions (None: all) of row `source` of a
        `DynamicCache` (a prefilled session's, or a batch prefill's)."""
        n = cache.get_seq_length() if length is None else length
        if n > self.capacity:
            raise ValueError(f"a sequence of {n} tokens does not fit {self.capacity} slots")
        for i, layer in enumerate(cache.layers):
            self.keys[i][row, :, :n] = layer.keys[source, :, :n]
            self.values[i][row, :, :n] = layer.values[source, :, :n]
        self.lengths[row] = n
        self.rope_delta[row] = rope_delta

    def add_rows(self, rows: int) -> None:
        """`rows` more empty rows."""
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = torch.cat([old, old.new_zeros((rows,) + old.shape[1:])])
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(rows)])
        self.rope_delta = torch.cat([self.rope_delta, self.rope_delta.new_zeros(rows)])

    def head(self, rows: int) -> "BatchedCache":
        """The first `rows` rows as a cache of their own, sharing this one's tensors (views: a step on
        it writes here), so a step over the low rows does no work for the idle rows above them."""
        view = object.__new__(BatchedCache)
        view.keys = [k[:rows] for k in self.keys]
        view.values = [v[:rows] for v in self.values]
        view.lengths, view.rope_delta = self.lengths[:rows], self.rope_delta[:rows]
        view.capacity = self.capacity
        return view

    def take(self, rows: torch.Tensor, span: int) -> "BatchedCache":
        """Rows `rows` (a tensor of row indices), their first `span` slots, as a cache of their own:
        copies, so a step on it does no work for the rows between them; `put` writes it back."""
        part = object.__new__(BatchedCache)
        part.keys = [k[rows, :, :span] for k in self.keys]
        part.values = [v[rows, :, :span] for v in self.values]
        part.lengths, part.rope_delta = self.lengths[rows], self.rope_delta[rows]
        part.capacity = span
        return part

    def put(self, rows: torch.Tensor, part: "BatchedCache", start: torch.Tensor, n: int) -> None:
        """Write back what a step on `part` (this cache's `rows`, taken when their lengths were
        `start`) added: `n` slots per row from there, and the new lengths."""
        slots = start[:, None] + torch.arange(n, device=start.device)[None, :]  # (k, n)
        mine = torch.arange(len(rows), device=start.device)[:, None]
        for store, made in ((self.keys, part.keys), (self.values, part.values)):
            for i, whole in enumerate(store):
                whole[rows[:, None], :, slots] = made[i][mine, :, slots]
        self.lengths[rows] = part.lengths

    def grow(self, capacity: int) -> None:
        """Room for `capacity` slots per row, keeping what every row holds."""
        if capacity <= self.capacity:
            return
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros(old.shape[:2] + (capacity,) + old.shape[3:])
                new[:, :, : self.capacity] = old
                store[i] = new
        self.capacity = capacity

    def rollback(self, row: int, n: int) -> None:
        if n < 0 or n > int(self.lengths[row]):
            raise ValueError(f"cannot roll row {row} back by {n}: it holds {int(self.lengths[row])} tokens")
        self.lengths[row] -= n


# the product sizes (rows) probed: every one up to 64, then a few up to the widest step a pool takes
_PROBED = tuple(range(1, 65)) + (80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024)


@functools.cache
def _product_exact_from(inputs: int, outputs: int, bias: bool, dtype: torch.dtype, device: str,
                        threads: int) -> int:
    """The fewest rows from which a product `F.linear` of this shape gives each row the bits it gets
    in any larger one, at `threads` threads. A BLAS picks its kernel by the product's shape: below a
    few rows it takes another path whose sums round differently (measured on MKL at one thread: 1 to
    3 rows differ, 4 and more agree; at two threads, sizes its split leaves uneven differ too). The
    kernel follows the shape alone, so random numbers of that shape tell it."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(outputs, inputs, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(outputs, generator=g).to(device=device, dtype=dtype) if bias else None
    x = torch.randn(_PROBED[-1], inputs, generator=g).to(device=device, dtype=dtype)
    with torch.inference_mode():
        whole = F.linear(x, w, b)
        least = _PROBED[-1]
        for m in reversed(_PROBED):
            if not torch.equal(F.linear(x[:m], w, b), whole[:m]):
                break
            least = m
    return least


class BatchedStep(FastStep):
    """`step(ids, counts, cache)` -> (logits (B, n, vocab), last hidden (B, n, hidden)) for each row's
    first counts[b] tokens of `ids` (B, n); the rest of a row's outputs are padding's."""

    def exact_from(self) -> int | None:
        """The fewest rows x tokens a step must run over for each row's numbers to be, bit for bit,
        what a step over more rows gives it (so a step over copies of a few rows can stand in for
        the step over all of them); None where no size is known to: more than one thread (a
        reduction over few rows may be split between threads) or attention without SDPA."""
        if torch.get_num_threads() != 1 or not self.sdpa:
            return None
        products = [(qp.weight, qp.bias is not None) for layer in self.layers for qp in layer[2:5]]
        products += [(w, False) for layer in self.layers for w in (layer[5], *layer[8:11])] + [(self.lm_head, False)]
        return max(_product_exact_from(w.shape[1], w.shape[0], bias, w.dtype, str(w.device), 1)
                   for w, bias in products)

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.rotary.inv_freq.to(device=positions.device, dtype=torch.float)
        cos, sin = freqs.cos() * self.rope_scale, freqs.sin() * self.rope_scale
        cos, sin = torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)
        return cos[:, None], sin[:, None]  # (B, 1, n, head_dim)

    def _mask(self, cache: BatchedCache, counts: torch.Tensor, n: int, span: int) -> torch.Tensor:
        """(B, 1, n, span): query j of row b sees slots up to length[b] + j; a padding query sees slot 0
        only (its output is never read; a row of all-False would give NaN)."""
        j = torch.arange(n, device=counts.device)
        cols = torch.arange(span, device=counts.device)
        last = cache.lengths[:, None] + j[None, :]  # (B, n)
        live = j[None, :] < counts[:, None]
        last = torch.where(live, last, torch.zeros_like(last))
        return (cols[None, None, :] <= last[:, :, None])[:, None]

    def step(self, ids: torch.Tensor, counts: torch.Tensor, cache: BatchedCache,
             span: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`span`: the cache slots attention reads. None: up to the longest row (read from the
        device, a wait on it); a fixed span (e.g. the capacity) keeps the step free of host reads,
        so it can be captured as a CUDA graph and replayed (the caller keeps rows within it)."""
        b, n = ids.shape
        if b != cache.rows:
            raise ValueError(f"{b} rows of tokens for a cache of {cache.rows}")
        if span is None:
            span = int((cache.lengths + n).max())
            if span > cache.capacity:
                raise ValueError(f"a row would reach {span} tokens, over the cache's {cache.capacity} slots")
        slots = cache.lengths[:, None] + torch.arange(n, device=ids.device)[None, :]  # (B, n)
        h = F.embedding(ids, self.embed)  # (B, n, hidden)
        cos, sin = self._rope_rows(slots + cache.rope_delta[:, None], h.dtype)
        mask = self._mask(cache, counts, n, span)
        where = slots[:, None, :, None].expand(b, self.kv_heads, n, self.head_dim)
        groups = self.heads // self.kv_heads
        for (ln1, eps1, qp, kp, vp, o_w, ln2, eps2, gate_w, up_w, down_w, idx) in self.layers:
            x = self._rms(h, ln1, eps1)
            q = F.linear(x, qp.weight, qp.bias).view(b, n, -1, self.head_dim).transpose(1, 2)
            k = F.linear(x, kp.weight, kp.bias).view(b, n, -1, self.head_dim).transpose(1, 2)
            v = F.linear(x, vp.weight, vp.bias).view(b, n, -1, self.head_dim).transpose(1, 2)
            q = (q * cos) + (self._rotate_half(q) * sin)
            k = (k * cos) + (self._rotate_half(k) * sin)
            keys, values = cache.keys[idx], cache.values[idx]
            keys.scatter_(2, where, k)
            values.scatter_(2, where, v)
            k_all, v_all = keys[:, :, :span], values[:, :, :span]
            if self.sdpa:  # grouped-query attention without copying each key head `groups` times
                a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=self.scaling,
                                                   enable_gqa=groups > 1)
            else:
                if groups > 1:
                    k_all, v_all = k_all.repeat_interleave(groups, dim=1), v_all.repeat_interleave(groups, dim=1)
                w = torch.matmul(q, k_all.transpose(2, 3)) * self.scaling
                w = torch.softmax(w.masked_fill(~mask, torch.finfo(w.dtype).min), dim=-1, dtype=torch.float32)
                a = torch.matmul(w.to(q.dtype), v_all)
            h = h + F.linear(a.transpose(1, 2).reshape(b, n, -1), o_w)
            x = self._rms(h, ln2, eps2)
            h = h + F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)
        cache.lengths += counts
        h = self._rms(h, self.norm_w, self.norm_eps)
        return F.linear(h, self.lm_head), h
