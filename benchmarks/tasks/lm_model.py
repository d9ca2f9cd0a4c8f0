"""The single-pass language-model task's model (a small decoder-only transformer over bytes),
its per-sample loss and the measurement of what a step costs (``cost_probe``).

Why a transformer of this shape: the per-batch sifting arms pay a no-grad scoring forward
for every source batch and save backward passes; whether that pays depends on the ratio of
backward to forward and on the scoring forward's share of a training step, which are those
of a real model only when matrix multiplies dominate the step (a tiny MLP's step is mostly
framework overhead, and there the scoring forward costs nearly a whole step).
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256  # bytes


@dataclass(frozen=True)
class LMShape:
    layers: int = 2
    d_model: int = 128
    heads: int = 4
    context: int = 64

    def __post_init__(self) -> None:
        if min(self.layers, self.d_model, self.heads, self.context) < 1:
            raise ValueError(f"every LMShape field must be >= 1, got {self}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")

    def describe(self) -> str:
        return (
            f"decoder-only transformer: {self.layers} layers, d {self.d_model}, {self.heads} heads, "
            f"MLP 4d GELU, pre-LayerNorm, learned positions, context {self.context}, vocab {VOCAB} (bytes)"
        )


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ByteTransformer(nn.Module):
    """Byte-level GPT: logits ``[b, t, 256]`` for inputs ``[b, t]`` (any integer dtype)."""

    def __init__(self, shape: LMShape):
        super().__init__()
        self.shape = shape
        self.tok = nn.Embedding(VOCAB, shape.d_model)
        self.pos = nn.Parameter(torch.zeros(shape.context, shape.d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.heads) for _ in range(shape.layers))
        self.ln = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens.long()) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def sequence_losses(model: nn.Module, seq: torch.Tensor) -> torch.Tensor:
    """Per-sample loss: each window's mean next-byte cross-entropy (nats), shape ``[b]``."""
    logits = model(seq[:, :-1])
    target = seq[:, 1:].long()
    per_token = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), reduction="none")
    return per_token.view(target.shape).mean(dim=1)


@torch.no_grad()
def heldout_bpb(model: nn.Module, heldout: torch.Tensor, device: torch.device, chunk: int = 64) -> float:
    """Held-out loss in bits per byte: the mean next-byte cross-entropy over every held-out
    position, / ln 2 (eval mode, no grad; the model's mode is restored)."""
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, heldout.shape[0], chunk):
        total += float(sequence_losses(model, heldout[i : i + chunk].to(device)).sum().cpu())
    model.train(was)
    return total / heldout.shape[0] / math.log(2)


def cost_probe(
    make: Callable[[], nn.Module],
    batches: list[Any],
    device: torch.device,
    lr: float,
    wait: Callable[[], None] | None = None,
    repeats: int = 5,
    sync: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    per_sample: Callable[[nn.Module, Any], torch.Tensor] = sequence_losses,
) -> dict:
    """Times, on a throwaway model (``make()``: on ``device``, compiled where the run
    compiles), a training forward, a whole training step (forward, backward, Adam) and a
    no-grad scoring forward (eval mode) of the same batches, after one untimed round (which
    also compiles); the medians of ``repeats`` rounds. ``sync`` (torch-xla's graph cut)
    after every call, ``wait`` (the device) around each timed round; ``clock``: the run's
    (``time.process_time`` for the CPU clock); ``per_sample(model, batch)``: the per-sample
    losses (a batch is a tensor or a tuple of tensors). Returns the backward-and-optimizer to
    forward ratio and the scoring forward's share of a step."""
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def clocked(fn: Callable[[Any], torch.Tensor | None]) -> float:
        if wait:
            wait()
        t0 = clock()
        for seq in batches:
            out = fn(seq)  # held through the sync: torch-xla runs only the graphs of live tensors
            if sync:
                sync()
            del out
        if wait:
            wait()
        return clock() - t0

    def forward(seq: Any) -> torch.Tensor:
        return per_sample(model, seq).mean()

    def step(seq: Any) -> None:
        opt.zero_grad(set_to_none=True)
        per_sample(model, seq).mean().backward()
        opt.step()

    @torch.no_grad()
    def score(seq: Any) -> torch.Tensor:
        model.eval()
        losses = per_sample(model, seq)
        model.train()
        return losses

    batches = [tuple(t.to(device) for t in b) if isinstance(b, tuple) else b.to(device) for b in batches]
    rounds: dict[str, list[float]] = {"forward": [], "step": [], "score": []}
    for r in range(repeats + 1):
        times = {"forward": clocked(forward), "step": clocked(step), "score": clocked(score)}
        if r:  # the first round is the untimed warm-up
            for k, v in times.items():
                rounds[k].append(v)
    med = {k: sorted(v)[len(v) // 2] for k, v in rounds.items()}
    n = len(batches)
    return {
        "batches": n,
        "forward_s": round(med["forward"] / n, 6),
        "train_step_s": round(med["step"] / n, 6),
        "scoring_forward_s": round(med["score"] / n, 6),
        "backward_to_forward": round((med["step"] - med["forward"]) / med["forward"], 3),
        "scoring_share_of_step": round(med["score"] / med["step"], 3),
    }
