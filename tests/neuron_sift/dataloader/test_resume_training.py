"""Resume while the model trains: the scores change with every step, so a resumed run
emits the uninterrupted run's batches only if it scores every source batch after the same
optimizer steps. Model, optimizer and loader are checkpointed after every emitted batch
(and after a completed epoch) and each checkpoint is resumed to the end.

Weights are compared bit for bit: on CPU the same eager ops run in both runs; on XLA the
loop marks each step (``torch_xla.sync()`` after ``opt.step()``, as ``MpDeviceLoader`` and
torch-xla's optimizer-step helpers do), so a save, which materialises the weights, cuts no
graph that the uninterrupted run does not cut too. Without that mark the save moves the
graph boundaries, and whether two differently partitioned graphs round alike depends on
the CPU's or device's code generation (docs/checkpoints.md). The resumed loop marks a step
after restoring the model, optimizer and loader, so the restored tensors are device data
as after any step. The XLA test asserts that neither the saving run nor a resumed run
compiles a graph the uninterrupted run did not: the same graphs on the same inputs, which
is what makes the bitwise comparison portable.
"""

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from neuron_sift import RelativeProbabilisticSiftConfig, SiftingDataloader
from tests.helpers.state_roundtrip import roundtrip
from tests.neuron_sift.dataloader.fakes import Classifier

B, N, EPOCHS = 8, 22 * 8 + 5, 2  # 23 source batches per epoch, the last one of 5


class CrossEntropy:
    """The model's own per-sample loss: it changes with every training step."""

    def loss(self, model, transformed_batch, original_batch=None):
        _ids, x, y = original_batch
        return torch.nn.functional.cross_entropy(model(x), y, reduction="none")


def make(mode, device="cpu", delay=3, repeat=True, global_history=False):
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.arange(N), torch.randn(N, 10, generator=g), torch.randint(0, 3, (N,), generator=g))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=7)
    torch.manual_seed(11)
    model = Classifier().to(device)
    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=32,
            loss_based_sift_config={"sift_config": {"sift_delay": delay, "repeat_delay_per_epoch": repeat}},
            selection_mode=mode,
            seed=5,
            global_loss_history=global_history,
        ),
        orig_dataloader=DataLoader(data, batch_size=B, sampler=sampler),
        loss_impl=CrossEntropy(),
        model=model,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    return loader, sampler, model, opt


def mark_step(device):
    """The loop's step marker: ``torch_xla.sync()`` on an XLA device, nothing elsewhere."""
    if torch.device(device).type == "xla":
        import torch_xla

        return torch_xla.sync
    return lambda: None


def train(run, start_epoch=0, checkpoints=None, stop_at_len=False):
    """The user's loop: one SGD step per emitted batch, each step marked on XLA. Returns the
    emitted id lists.

    ``checkpoints``: a list to append (batches emitted so far, checkpoint) to, after every
    step and after every completed epoch. ``stop_at_len``: take ``len(loader)`` batches per
    epoch and stop there, as Lightning and the Hugging Face Trainer do.
    """
    loader, sampler, model, opt = run
    step_done = mark_step(next(model.parameters()).device)
    emitted = []
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        batches = itertools.islice(loader, len(loader)) if stop_at_len else loader
        for ids, x, y in batches:
            device = next(model.parameters()).device  # delayed batches pass through unmoved
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            step_done()
            emitted.append(ids.cpu().tolist())
            if checkpoints is not None:
                checkpoints.append((len(emitted), save(run, epoch)))
        if checkpoints is not None and not stop_at_len:  # the loader's epoch ended with the loop
            checkpoints.append((len(emitted), save(run, epoch + 1)))
    return emitted


def save(run, epoch):
    loader, _, model, opt = run
    state = {"loader": loader.state_dict(), "model": model.state_dict(), "opt": opt.state_dict()}
    return roundtrip({**state, "epoch": epoch})


def weights(model):
    return torch.cat([p.detach().cpu().flatten() for p in model.parameters()])


def check_every_cut(mode, device="cpu", every=1, stop_at_len=False, compile_count=None, **kw):
    """``compile_count``: the XLA backend's compile counter (None elsewhere)."""
    full_run = make(mode, device, **kw)
    full = train(full_run, stop_at_len=stop_at_len)
    assert len(full) > 2 * 10
    reference = make(mode, device, **kw)
    checkpoints = []
    compiled = compile_count() if compile_count else None
    assert train(reference, checkpoints=checkpoints, stop_at_len=stop_at_len) == full  # saving changes nothing
    if compile_count:  # the same graphs as the uninterrupted run: the saves moved no boundary
        assert compile_count() == compiled, f"{mode}: saving compiled {compile_count() - compiled} new graph(s)"
    assert torch.equal(weights(reference[2]), weights(full_run[2]))
    cuts = checkpoints[::every] + [checkpoints[-1]]
    epoch_ends = [i for i, (n, _) in enumerate(checkpoints) if i and checkpoints[i - 1][0] == n]
    assert stop_at_len or epoch_ends, "no checkpoint after a completed epoch"
    cuts += [checkpoints[i] for i in epoch_ends]
    for n, ckpt in cuts:
        run = make(mode, device, **kw)
        run[2].load_state_dict(ckpt["model"])
        run[3].load_state_dict(ckpt["opt"])
        run[0].load_state_dict(ckpt["loader"])
        mark_step(device)()  # the restored tensors become device data, as after any step
        compiled = compile_count() if compile_count else None
        rest = train(run, start_epoch=ckpt["epoch"], stop_at_len=stop_at_len)
        if compile_count:  # the uninterrupted run's graphs, so its rounding too
            assert compile_count() == compiled, f"{mode}: the run resumed at {n} compiled a graph of its own"
        assert full[:n] + rest == full, f"{mode}: resumed after {n} emitted batches"
        assert torch.equal(weights(run[2]), weights(full_run[2])), f"{mode}: weights after resuming at {n}"
    return full_run[0]


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_resume_while_training_matches_at_every_cut(mode, one_thread):
    check_every_cut(mode)


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_resume_without_repeated_delay(mode, one_thread):
    check_every_cut(mode, repeat=False, every=3)


def test_consumer_that_stops_at_len_loses_nothing_in_a_resumed_epoch(one_thread):
    """Fixed mode: ``len()`` is exact, also for what is left of a resumed epoch, and the
    trailing source batches are still scored before the epoch's last batch."""
    loader = check_every_cut("fixed", stop_at_len=True)
    assert loader.counts.num_orig_samples_seen == EPOCHS * N


def test_len_of_a_resumed_epoch_is_what_it_still_emits(one_thread):
    run = make("fixed")
    checkpoints = []
    train(run, checkpoints=checkpoints)
    for n, ckpt in checkpoints[::4]:
        resumed = make("fixed")
        resumed[0].load_state_dict(ckpt["loader"])
        resumed[1].set_epoch(ckpt["epoch"])
        expected = len(resumed[0])
        assert sum(1 for _ in resumed[0]) == expected, f"after {n}"


@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_exact_length_loader_resumes_while_training(mode, one_thread):
    """Epochs of 9 batches cut across passes over the source; the pass counter and the
    position in the open epoch and pass are part of the state."""
    from neuron_sift.integrations.schedules import ExactLengthLoader

    epochs = 4

    def build():
        loader, sampler, model, opt = make(mode)
        return ExactLengthLoader(loader, steps_per_epoch=9), sampler, model, opt

    def go(run, start=0, checkpoints=None):
        ell, _, model, opt = run
        out = []
        for epoch in range(start, epochs):
            for ids, x, y in ell:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                out.append(ids.tolist())
                if checkpoints is not None:
                    state = {"ell": ell.state_dict(), "model": model.state_dict(), "opt": opt.state_dict()}
                    checkpoints.append((len(out), roundtrip({**state, "epoch": epoch})))
        return out

    full_run = build()
    full = go(full_run)
    assert len(full) == 9 * epochs and full_run[0].passes >= 2
    checkpoints = []
    assert go(build(), checkpoints=checkpoints) == full
    for n, ckpt in checkpoints:
        run = build()
        run[2].load_state_dict(ckpt["model"])
        run[3].load_state_dict(ckpt["opt"])
        run[0].load_state_dict(ckpt["ell"])
        assert len(run[0]) == 9 - (n - 9 * ckpt["epoch"])
        rest = go(run, start=ckpt["epoch"])
        assert full[:n] + rest == full, f"resumed after {n}"
        assert torch.equal(weights(run[2]), weights(full_run[2]))
        assert run[0].passes == full_run[0].passes


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["probabilistic", "fixed", "topk"])
def test_resume_while_training_on_xla(mode, one_thread):
    torch_xla = pytest.importorskip("torch_xla")
    from neuron_sift.backends.xla import xla_compile_count

    check_every_cut(mode, device=torch_xla.device(), every=5, compile_count=xla_compile_count)
