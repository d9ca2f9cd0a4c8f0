"""``score_dataset`` on torch-xla's CPU device: the losses are eager's (within float tolerance)
and the model sees one input shape, the short last batch padded with its last sample."""

import pytest
import torch

try:  # without torch-xla these tests are deselected by scripts/test.sh, skipped by tests/conftest.py
    import torch_xla
except ImportError:
    torch_xla = None

from neuron_sift import score_dataset  # noqa: E402
from tests.neuron_sift.scoring.reference_helpers import FEATURES, IdData, RecordingLoss, reference_model  # noqa: E402

pytestmark = pytest.mark.xla

N, B = 23, 4  # 5 full batches and one of 3


def test_on_xla_the_losses_are_eagers_and_the_model_sees_one_shape(tmp_path):
    eager = score_dataset(
        reference_model(), IdData(N), RecordingLoss(), tmp_path / "eager", batch_size=B, progress=False
    )
    loss = RecordingLoss()
    model = reference_model().to(torch_xla.device())
    table = score_dataset(model, IdData(N), loss, tmp_path / "xla", batch_size=B, save_every=4, progress=False)
    assert set(loss.shapes) == {(B, FEATURES)}
    assert loss.ids[-1] == [20, 21, 22, 22]  # padded with the last sample, its loss dropped
    assert table.covered == N
    torch.testing.assert_close(table.losses(), eager.losses())
    assert table.losses().device == torch.device("cpu")
