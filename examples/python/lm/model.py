"""A decoder-only byte-level transformer: learned token and position embeddings, pre-LayerNorm
blocks of causal multi-head self-attention and a GELU MLP, dropout, and an output layer tied to
the token embedding (logits = h @ E^T).

The causal mask is a bool tensor made in forward (torch.triu), not a registered buffer: a mask has
no business in the checkpoint (co2.torch would not average it either: it averages only running
statistics and broadcasts other buffers once, bindings/python/README.md "Buffers").
"""
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256   # bytes


@dataclasses.dataclass(frozen=True)
class Size:
    d_model: int
    layers: int
    heads: int
    context: int
    batch: int          # sequences per rank and step
    dropout: float = 0.1

    def parameters(self):
        d = self.d_model
        per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return VOCAB * d + self.context * d + self.layers * per_block + 2 * d


# "small" (170,560 parameters) is the quality benchmark's model: torch here runs on a generic
# BLAS (about 4-8 GFLOP/s per core), so a step of it takes 40-95 ms per rank on this 2-core
# machine; "medium" (834,304) takes about 5x that; "tiny" is the smoke tests'.
SIZES = {
    "tiny": Size(d_model=32, layers=1, heads=2, context=32, batch=4),
    "small": Size(d_model=64, layers=3, heads=4, context=64, batch=4),
    "medium": Size(d_model=128, layers=4, heads=4, context=64, batch=8),
}


class Block(nn.Module):
    def __init__(self, size):
        super().__init__()
        d = size.d_model
        self.heads = size.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(size.dropout)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = self.drop(scores.masked_fill(future, float("-inf")).softmax(-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.drop(self.attention(self.ln1(x)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class ByteLM(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.size = size
        self.tokens = nn.Embedding(VOCAB, size.d_model)
        self.positions = nn.Embedding(size.context, size.d_model)
        self.drop = nn.Dropout(size.dropout)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.ln_f = nn.LayerNorm(size.d_model)
        self.reset_parameters()

    def reset_parameters(self):
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2's scheme: residual projections scaled down by the depth.
                std = 0.02 / math.sqrt(2 * self.size.layers) if name.endswith(
                    ("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.drop(self.tokens(idx) + self.positions(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h) @ self.tokens.weight.t()   # tied output layer

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
