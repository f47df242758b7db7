"""A small GPT (nanoGPT-like causal language model) for the Tri-Accel loop.

Token and position embeddings, ``n_layer`` pre-LayerNorm blocks (causal self-attention, then an
MLP of 4x width with GELU, each added to the residual stream), a final LayerNorm, and a linear head
whose weight is the token embedding's (tied). Inputs are token ids int64 [B, T] with T <= block_size;
the output is logits [B, T, vocab_size]. Initialisation as GPT-2: N(0, 0.02), the residual
projections scaled by 1/sqrt(2 n_layer), biases zero.

How the per-layer precision machinery sees it (triaccel.precision.layer_plan): every projection
(attention's c_attn and c_proj, the MLP's c_fc and c_proj) and both embeddings are layers with a level
of their own; the tied lm_head holds no weight of its own and runs at the token embedding's level, so
promoting ``wte`` promotes the output logits. The LayerNorms are no layers. The attention itself (softmax(QK^T / sqrt(d)) V, in
``F.scaled_dot_product_attention``) runs in the dtype its block's c_attn produced: promoting c_attn
to fp32 promotes the attention logits with it. The residual stream stays fp32 (the embeddings are
fp32 and fp32 + a 16-bit branch is fp32), so the LayerNorms normalise fp32 whatever the levels.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from triaccel.errors import ConfigError

KEY = "model.init_args"


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # q, k, v for every head at once
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{KEY}.{key}: {msg}")


class GPT(nn.Module):
    """``vocab_size`` and ``block_size`` come from the data factory's meta when the config leaves them unset."""

    def __init__(self, vocab_size: int, block_size: int = 128, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
                 dropout: float = 0.0, bias: bool = False):
        super().__init__()
        for key, v in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                       ("n_head", n_head), ("n_embd", n_embd)):
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, key,
                   f"must be an integer >= 1, got {v!r}")
        _check(n_embd % n_head == 0, "n_embd", f"must be a multiple of n_head ({n_head}), got {n_embd}")
        _check(isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0 <= dropout < 1, "dropout",
               f"must be in [0, 1), got {dropout!r}")
        _check(isinstance(bias, bool), "bias", f"must be true or false, got {bias!r}")
        self.vocab_size, self.block_size = vocab_size, block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds tokens and scores them
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual branches: their sum over 2 n_layer branches keeps its scale
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        self.register_buffer("pos", torch.arange(block_size), persistent=False)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def blocks(self) -> list[nn.Module]:
        """The transformer blocks: what activation checkpointing wraps one by one."""
        return list(self.h)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.block_size:
            raise ConfigError(f"{KEY}.block_size: the model has {self.block_size} positions, the data's windows "
                              f"hold {T} tokens (data.init_args.block_size): make them equal, or leave the "
                              f"model's unset")
        x = self.drop(self.wte(idx) + self.wpe(self.pos[:T]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))
