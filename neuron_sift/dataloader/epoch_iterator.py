"""Moved to ``neuron_sift.dataloader.sifting_pass`` (0.8.0), its ``SiftingEpoch`` renamed
``SiftingPass`` (one pass over the source, beside the epoch mode's ``neuron_sift.epoch``);
this path is removed in 0.9.0."""

from neuron_sift.shared.moved import moved_module

__getattr__ = moved_module(
    __name__, "neuron_sift.dataloader.sifting_pass", remove_in="0.9.0", renamed={"SiftingEpoch": "SiftingPass"}
)
