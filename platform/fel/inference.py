"""Serving a finetuned model: one input at a time (a CT query, an AD pair), fast.

The predictor runs batch 1 with no padding, in `torch.inference_mode()`, on a dedicated forward
(`FastEncoder`) built from the weights of the trained `model.Encoder` that skips what serving does
not need:
- no nn.Module dispatch, dropout, attention masks or batch dimension: plain linear/`layer_norm`/bmm
  calls on (T, H) rows;
- linears run on weights packed once for MKL's small-batch GEMM or oneDNN's, whichever this CPU runs
  faster (plain addmm where both are missing; see `_Linear` and `default_backend`);
- the last layer computes its queries, attention output and FFN only for the rows a head reads
  (each word's first piece for CT, [CLS] for AD) -- its keys and values still cover every token; a head
  that averages a word's pieces (`FinetuneConfig.word_pooling`) reads every row;
- no MLM decoder (the saved model has none) and only the head that is asked for.
Its outputs equal `model.Encoder`'s in eval mode to float rounding (a test keeps it so).

The verbs (`Predictor.bracket`, `Predictor.acronym_score`, ...) are the tasks' own (`Task.serving_verbs`,
in tasks/): the predictor holds the fast encoder and the heads' tensors, each task reads its head.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from alignlab.platform.encoder.model import Encoder
from alignlab.platform.fel.finetune import Finetuned, load_finetuned
from alignlab.platform.fel.head_input import head_input
from alignlab.platform.tasks.task import registered_tasks, word_means


def _mkl_linear_ok() -> bool:
    """MKL's packed-weight linear (what torch.compile's CPU backend uses for fp32) is there and right."""
    try:
        if not torch.backends.mkl.is_available():
            return False
        x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
        with torch.inference_mode():
            y = torch.ops.mkl._mkl_linear(x, torch.ops.mkl._mkl_reorder_linear_weight(w, 16), w, b, 3)
        return bool(torch.allclose(y, F.linear(x, w, b), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def _mkldnn_linear_ok() -> bool:
    """oneDNN's prepacked linear is there and gives linear's numbers."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
        with torch.inference_mode():
            y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 16), b, "gelu", [],
                                                   "none")
        return bool(torch.allclose(y, F.gelu(F.linear(x, w, b)), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


_BACKEND: str | None = None


def default_backend() -> str:
    """The fastest available linear backend on this CPU, timed once per process on a query-sized GEMM.

    Timed rather than fixed because the ranking depends on the CPU: on the project's Intel Xeon MKL's packed
    GEMM was fastest; on an AMD EPYC (same 2 cores, same torch) MKL took 2.6x as long as oneDNN
    (1,066 vs 407 us for 16x768 @ 768x3072) and the 768x3 tagger missed its latency goal with it."""
    global _BACKEND
    if _BACKEND is None:
        ok = [b for b, check in (("mkl", _mkl_linear_ok), ("mkldnn", _mkldnn_linear_ok)) if check()]
        _BACKEND = ok[0] if len(ok) == 1 else "aten" if not ok else min(ok, key=_linear_seconds)
    return _BACKEND


def _linear_seconds(backend: str, rows: int = 16, hidden: int = 768, reps: int = 30) -> float:
    """Median seconds of one (rows x hidden) @ (hidden x 4 hidden) linear on `backend`."""
    import time

    g = torch.Generator().manual_seed(0)
    lin = _Linear(torch.randn(4 * hidden, hidden, generator=g), torch.zeros(4 * hidden), backend)
    x = torch.randn(rows, hidden, generator=g)
    times = []
    with torch.inference_mode():
        for i in range(reps + 5):
            t = time.perf_counter()
            lin(x)
            if i >= 5:
                times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


class _Linear:
    """y = x W^T + b, optionally followed by GELU or a residual add, on weights prepared once.

    Backends (`default_backend` times them on this machine and takes the fastest; measured figures are in
    benchmarks/README.md, inference latency):
    - "mkl": MKL's packed-weight GEMM (`cblas_sgemm_pack`); the packed copy costs extra memory (one pack, sized
      for up to `max_rows`);
    - "mkldnn": oneDNN's blocked weight layout with GELU/residual fused into the call;
    - "aten": addmm on the (out, in) weight, for builds with neither.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, backend: str, max_rows: int = 128):
        self.w, self.b, self.backend = weight.detach().contiguous(), bias.detach().contiguous(), backend
        if backend == "mkl":
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.w, max_rows)
        elif backend == "mkldnn":
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.w, 16)
        elif backend != "aten":
            raise ValueError(f"unknown linear backend {backend!r}: use 'mkl', 'mkldnn' or 'aten'")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.packed, self.w, self.b, x.shape[0])
        if self.backend == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b, "none", [], "")
        return torch.addmm(self.b, x, self.w.t())

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b, "gelu", [], "none")
        return F.gelu(self(x))

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.backend == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.b, "add")
        return self(x).add_(residual)


class FastEncoder:
    """`model.Encoder`'s eval-mode forward for one unpadded sequence, on the encoder's own weights."""

    def __init__(self, encoder: Encoder, backend: str | None = None):
        cfg = encoder.cfg
        self.backend = backend or default_backend()
        self.H, self.num_heads, self.head_dim = cfg.hidden, cfg.num_heads, cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.tok = encoder.tok.weight.detach()
        self.pos = encoder.pos.weight.detach()
        self.seg = encoder.seg.weight.detach()
        # Position + segment-0 rows precomputed: a CT query (all segment 0) needs one add less.
        self.pos_seg0 = (self.pos + self.seg[0]).contiguous()
        self.ln = (encoder.ln.weight.detach(), encoder.ln.bias.detach(), encoder.ln.eps)
        self.pre_ln = cfg.norm == "pre"
        fl = encoder.final_ln
        self.final_ln = (fl.weight.detach(), fl.bias.detach(), fl.eps) if fl is not None else None
        # ModelConfig.alibi: the distance bias of every query on every key [heads, max_len, max_len], or None.
        self.bias = encoder.distance_bias(cfg.max_len, torch.float32, self.tok.device, None)[0] if cfg.alibi else None
        H, lin = cfg.hidden, lambda w, b: _Linear(w, b, self.backend, cfg.max_len)
        self.layers = []
        for i, layer in enumerate(encoder.layers):
            w, b = layer.qkv.weight.detach(), layer.qkv.bias.detach()
            # The last layer's queries may cover only some rows, so its q and kv projections are kept apart.
            proj = ({"q": lin(w[:H], b[:H]), "kv": lin(w[H:], b[H:])} if i == len(encoder.layers) - 1
                    else {"qkv": lin(w, b)})
            self.layers.append({
                **proj,
                "attn_out": lin(layer.attn_out.weight, layer.attn_out.bias),
                "ffn_in": lin(layer.ffn_in.weight, layer.ffn_in.bias),
                "ffn_out": lin(layer.ffn_out.weight, layer.ffn_out.bias),
                "ln1": (layer.ln1.weight.detach(), layer.ln1.bias.detach(), layer.ln1.eps),
                "ln2": (layer.ln2.weight.detach(), layer.ln2.bias.detach(), layer.ln2.eps),
            })

    def __call__(self, ids_T: torch.Tensor, seg_T: torch.Tensor | None = None,
                 rows: torch.Tensor | None = None, layers: str = "last") -> torch.Tensor:
        """Final hidden states (T, H), or (len(rows), H) for just `rows` (computed only there in the last layer).
        With layers="all", what `model.Encoder` gives for it: the embedding output and every layer's, each
        layer-normalised, the last as is, side by side (T or len(rows), (num_layers + 1) * H)."""
        T, H, nh, d = ids_T.shape[0], self.H, self.num_heads, self.head_dim
        if seg_T is None:
            x = self.tok.index_select(0, ids_T) + self.pos_seg0[:T]
        else:
            x = self.tok.index_select(0, ids_T) + self.pos[:T] + self.seg.index_select(0, seg_T)
        x = F.layer_norm(x, (H,), *self.ln[:2], self.ln[2])
        last = len(self.layers) - 1
        states = []  # each layer's input, every row (layers="all")
        for i, L in enumerate(self.layers):
            if layers == "all":
                states.append(x)
            # Pre-LN: attention reads the normalized stream `h`, the residual adds to the raw one `res`.
            h = F.layer_norm(x, (H,), *L["ln1"][:2], L["ln1"][2]) if self.pre_ln else x
            res = x
            if i == last:
                k, v = L["kv"](h).view(T, 2, nh, d).permute(1, 2, 0, 3)
                if rows is not None:
                    h, x, res = h.index_select(0, rows), x.index_select(0, rows), res.index_select(0, rows)
                q = L["q"](h).view(-1, nh, d).transpose(0, 1)
            else:
                q, k, v = L["qkv"](h).view(T, 3, nh, d).permute(1, 2, 0, 3)
            # Plain bmm/softmax: at a dozen tokens SDPA's dispatch and checks cost ~4x the arithmetic.
            s = torch.bmm(q * self.scale, k.transpose(1, 2))
            if self.bias is not None:
                b = self.bias[:, :T, :T]
                s = s + (b.index_select(1, rows) if i == last and rows is not None else b)
            a = torch.bmm(torch.softmax(s, -1), v)
            a = a.transpose(0, 1).reshape(-1, H)
            w1, b1, eps1 = L["ln1"]
            w2, b2, eps2 = L["ln2"]
            if self.pre_ln:
                x = L["attn_out"].add(a, res)
                x = L["ffn_out"].add(L["ffn_in"].gelu(F.layer_norm(x, (H,), w2, b2, eps2)), x)
            else:
                x = F.layer_norm(L["attn_out"].add(a, x), (H,), w1, b1, eps1)
                x = F.layer_norm(L["ffn_out"].add(L["ffn_in"].gelu(x), x), (H,), w2, b2, eps2)
        if self.final_ln is not None:
            x = F.layer_norm(x, (H,), *self.final_ln[:2], self.final_ln[2])
        if layers != "all":
            return x
        if rows is not None:
            states = [s.index_select(0, rows) for s in states]
        return torch.cat([F.layer_norm(s, (H,)) for s in states] + [x], -1)


class Predictor:
    """A task's prediction for one input from a finetuned model (never the MLM decoder, never padding)."""

    def __init__(self, ft: Finetuned):
        self.ft, self.tok = ft, ft.tok
        self.max_len = ft.model.cfg.max_len
        self.task_options = ft.cfg.task_options  # the tasks' own input options (`Task.options`)
        self.enc = FastEncoder(ft.model.encoder)
        self.heads = {name: _head_tensors(head) for name, head in ft.model.heads.items()}

    @classmethod
    def load(cls, fdir: str | Path) -> "Predictor":
        return cls(load_finetuned(fdir))

    def unit_vectors(self, head: str, ids_T: torch.Tensor, seg_T: torch.Tensor | None,
                     rows: torch.Tensor) -> torch.Tensor:
        """What `head` reads at `rows` (a token task's word first pieces, or [CLS]) of one unpadded input
        (`head_input.HeadInput`: the last layer or every layer, a word's first piece or its pieces averaged)."""
        reads = head_input(self.ft.model.heads[head])
        if reads.pooling == "first":
            return self.enc(ids_T, seg_T, rows, reads.layers)
        first = torch.zeros(1, len(ids_T), dtype=torch.bool)  # a word's pieces: every row of the last layer
        first[0, rows] = True
        return word_means(self.enc(ids_T, seg_T, None, reads.layers)[None], first, torch.ones_like(first))[0, rows]

    def need(self, head: str) -> None:
        if head not in self.heads:
            raise ValueError(f"finetuned model {self.ft.fid} has no {head!r} head (it has {', '.join(self.heads)})")

    def __getattr__(self, verb: str):
        """A task's serving verb, bound to this predictor: `pred.bracket(query)` is the tagging task's
        `bracket(pred, query)` (`Task.serving_verbs`)."""
        if not verb.startswith("_"):
            for t in registered_tasks():
                if verb in t.serving_verbs:
                    return functools.partial(getattr(t, verb), self)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {verb!r}")


def _head_tensors(head: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """(W^T, b) of a TokenHead; (pool W^T, pool b, W^T, b) of a SequenceHead (dropout is off at inference)."""
    t = lambda lin: (lin.weight.detach().t().contiguous(), lin.bias.detach())  # noqa: E731
    return (*t(head.pool), *t(head.out)) if hasattr(head, "pool") else t(head.out)
