"""Per-batch sifting under torchrun + gloo: equal steps per rank, no hang, synced params.
The worker (``ddp_worker.py --mode per-batch``) is shared with the epoch mode's tests."""

import pytest

from tests.neuron_sift import torchrun
from tests.neuron_sift.torchrun import results


def launch(tmp_path, world, *args, tag="run"):
    return torchrun.launch(torchrun.WORKER, tmp_path, world, "--mode", "per-batch", *args, tag=tag)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("selection", ["probabilistic", "fixed"])
def test_equal_steps_and_synchronised_parameters(tmp_path, selection, world):
    out = launch(tmp_path, world, "--selection", selection, "--epochs", "3")
    runs = results(out, world)
    steps = [r["steps"] for r in runs]
    assert all(s == steps[0] for s in steps), steps
    assert all(n > 0 for n in steps[0])
    assert all(r["params"] == runs[0]["params"] for r in runs)  # DDP kept them identical
    for r in runs:
        c = r["counts"]
        assert c["num_orig_samples_seen"] == c["num_orig_samples_kept"] + c["num_orig_samples_sifted"]
        kept = c["num_samples_emitted"] + c["num_samples_pending"] + c["num_samples_dropped"]
        assert c["num_orig_samples_kept"] == kept
        assert all(most <= r["max_pending"] for _, most, _ in r["backlog"])
    # Ranks keep different samples (independent draws, different data), yet step together.
    assert runs[0]["ids"] != runs[1]["ids"]


@pytest.mark.slow
def test_global_history_is_identical_on_every_rank(tmp_path):
    out = launch(tmp_path, 2, "--selection", "probabilistic", "--global-history", "--epochs", "2")
    a, b = results(out, 2)
    assert a["steps"] == b["steps"]
    assert a["fill"] == b["fill"] == 64
    assert a["history"] == b["history"]


def check_accounting(runs):
    for r in runs:
        c = r["counts"]
        assert c["num_orig_samples_seen"] == c["num_orig_samples_kept"] + c["num_orig_samples_sifted"]
        kept = c["num_samples_emitted"] + c["num_samples_pending"] + c["num_samples_dropped"]
        assert c["num_orig_samples_kept"] == kept
        assert c["num_samples_emitted"] == sum(len(b) for b in r["ids"])


@pytest.mark.slow
@pytest.mark.parametrize("world,epochs", [(2, 30), (3, 8)])
def test_skewed_losses_keep_every_backlog_bounded(tmp_path, world, epochs):
    """Rank 0's data is hard (random labels), its peers' easy, the loss history global: rank
    0 keeps far more than its peers, yet its pending samples stay within max_pending (the
    excess is dropped and counted) and every rank takes the same steps."""
    out = launch(
        tmp_path, world, "--selection", "probabilistic", "--global-history", "--skewed", "--epochs", str(epochs)
    )
    runs = results(out, world)
    assert all(r["steps"] == runs[0]["steps"] for r in runs)
    assert all(r["params"] == runs[0]["params"] for r in runs)
    check_accounting(runs)
    bound = runs[0]["max_pending"]
    assert bound == 4 * 16
    for r in runs:
        assert all(end <= most <= bound for end, most, _ in r["backlog"]), r["backlog"]
    hard, easy = runs[0]["counts"], runs[1]["counts"]
    assert hard["num_orig_samples_kept"] > easy["num_orig_samples_kept"] * 1.2
    assert hard["num_samples_dropped"] > 0
    # Rank 0 is at its bound for most of the run: without it the backlog grows every epoch.
    assert max(most for _, most, _ in runs[0]["backlog"][epochs // 2 :]) > bound - 16


@pytest.mark.slow
@pytest.mark.parametrize(
    "selection,extra",
    [("probabilistic", ["--global-history", "--skewed"]), ("probabilistic", []), ("fixed", [])],
    ids=["probabilistic-global-skewed", "probabilistic", "fixed"],
)
def test_each_rank_resumes_its_own_state(tmp_path, selection, extra):
    """The model trains (its cross-entropy is the score) and the checkpoint holds model,
    optimizer and loader; in probabilistic mode it is taken between two batches of one
    agreement, so the rest of the agreed batches must come out first after resuming."""
    common = ["--selection", selection, "--epochs", "3", "--lr", "0.2", *extra]
    if selection == "probabilistic":
        common.append("--save-mid-agreement")
    out = launch(tmp_path, 2, *common, "--save-after", "20", tag="full")
    full = results(out, 2)
    saved_at = full[0]["saved_at"]
    assert saved_at is not None and all(r["saved_at"] == saved_at for r in full)
    if selection == "probabilistic":
        assert saved_at["budget_left"] > 0
    k = saved_at["step"]
    resumed_out = launch(tmp_path, 2, *common, "--load", tag="full")
    resumed = results(resumed_out, 2, resumed=True)
    for r in range(2):
        assert resumed[r]["ids"] == full[r]["ids"][k:]
        assert sum(resumed[r]["steps"]) == sum(full[r]["steps"]) - k
        assert resumed[r]["params"] == full[r]["params"]
        assert resumed[r]["counts"] == full[r]["counts"]
