"""neuron_sift: loss-based data sifting (Selective Backprop) for PyTorch and torch-xla.

A drop-in, open replacement of SageMaker's ``smart_sifting``: replace the package name
and the same script runs. The public API is re-exported here; the smart_sifting module
paths (``neuron_sift.sift_config.sift_configs`` etc.) hold the same objects.
"""

from neuron_sift._version import __version__
from neuron_sift.backends.traced_loss import TracedLoss
from neuron_sift.data_model.data_model_interface import SiftingBatch, SiftingBatchTransform
from neuron_sift.data_model.default_batch import DefaultBatchTransform
from neuron_sift.data_model.list_batch import ListBatch
from neuron_sift.data_model.tensor_batch import TensorBatch
from neuron_sift.dataloader.sift_dataloader import SiftingCounts, SiftingDataloader
from neuron_sift.epoch.loader import EpochSiftingDataloader
from neuron_sift.exceptions import (
    LossImplementationNotProvidedException,
    LossOutputException,
    SiftConfigValidationException,
    UnsupportedDataFormatException,
)
from neuron_sift.loss.abstract_sift_loss_module import Loss
from neuron_sift.scoring.reference_table import ReferenceTable, dataset_fingerprint
from neuron_sift.scoring.score_dataset import score_dataset
from neuron_sift.sift_config.epoch_config import EpochSiftConfig
from neuron_sift.sift_config.sift_configs import (
    LossConfig,
    RelativeProbabilisticSiftConfig,
    SiftingBaseConfig,
)

__all__ = [
    "DefaultBatchTransform",
    "EpochSiftConfig",
    "EpochSiftingDataloader",
    "ListBatch",
    "Loss",
    "LossConfig",
    "LossImplementationNotProvidedException",
    "LossOutputException",
    "ReferenceTable",
    "RelativeProbabilisticSiftConfig",
    "SiftConfigValidationException",
    "SiftingBaseConfig",
    "SiftingBatch",
    "SiftingBatchTransform",
    "SiftingCounts",
    "SiftingDataloader",
    "TensorBatch",
    "TracedLoss",
    "UnsupportedDataFormatException",
    "__version__",
    "dataset_fingerprint",
    "score_dataset",
]
