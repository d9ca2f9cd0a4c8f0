"""Static-shape tensor kernels of sifting (installed as ``neuron_sift.kernels``).

Every function here is pure: tensors in, tensors out, output shapes fixed by the
input shapes and static Python ints (B, H, k) alone, never by data. No host reads,
no boolean-mask indexing, no ``nonzero``. The same code runs eagerly on CPU/CUDA and
is traced into a fixed set of XLA graphs on torch-xla / Neuron. No kernel asks what
device it runs on: where the best formulation differs by device (``searchsorted`` or a
sort-merge), the backend passes the choice as a static argument (``method``).
"""

from .percentile import percentile_rank
from .random import uniform_from_counter
from .ring_buffer import ring_buffer_update
from .selection import (
    bernoulli_keep,
    compact_indices,
    gumbel_topk_indices,
    keep_log_probability,
    keep_probability,
    top_k_indices,
)

__all__ = [
    "bernoulli_keep",
    "compact_indices",
    "gumbel_topk_indices",
    "keep_log_probability",
    "keep_probability",
    "percentile_rank",
    "ring_buffer_update",
    "top_k_indices",
    "uniform_from_counter",
]
