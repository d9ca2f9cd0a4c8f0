"""Preemption under torchrun: a rank killed by SIGKILL in the middle of a sifted epoch,
the group restarted by ``torchrun --max-restarts=1``, every rank resumed from the newest
checkpoint all ranks wrote. The loop and the checkpoint functions are the ones
docs/checkpoints.md shows (its blocks are written to a file the worker runs), so the
recipe is what is tested; the worker (``preemption_worker.py``) adds the logging and the
fault. Both loaders, and both of the page's checkpoint plumbings: torch.distributed.checkpoint
(``dcp``) and per-rank files written by hand (``files``).

What a user relies on: the run finishes (no hang, exit 0); what is retrained after the
restart is exactly the part after the checkpoint (the same ids, in the same order), and
nothing before it; the final accounting of every epoch is the epoch's plan, each sample
once; the ranks end with the same parameters. The epoch loader's cases run with either
score table (under a sharded one each rank's plan is its own share: an epoch's plan is
their union, and each rank's is the same in both attempts).
"""

import json

import pytest

from tests.neuron_sift import torchrun
from tests.neuron_sift.epoch.helpers import worker
from tests.neuron_sift.integrations.readme_examples import example

WORKER = worker("preemption_worker.py")
WORLD = 2
EVERY, KILL_AFTER = 8, 3  # checkpoint every 8 steps; rank 1 dies 3 steps after one


PLUMBING = {
    "files": "Checkpoint files: per rank, atomic, newest complete checkpoint",
    "dcp": "Checkpoints with torch.distributed.checkpoint",
}


def recipe(tmp_path, checkpoints: str) -> str:
    """The documentation's checkpoint functions (``checkpoints``: its per-rank files or its
    torch.distributed.checkpoint ones) and loops, as one script."""
    path = tmp_path / f"recipe_{checkpoints}.py"
    blocks = [example(PLUMBING[checkpoints]), example("The loop: EpochSiftingDataloader")]
    path.write_text("\n\n".join([*blocks, example("The loop: SiftingDataloader")]), encoding="utf-8")
    return str(path)


def launch(tmp_path, mode: str, *args: str, checkpoints="files", world=WORLD, restarts=1, finishes=True, tag=None):
    """The worker under torchrun with ``restarts`` restarts allowed; returns (per-rank log
    entries, per-rank results: None for a run expected to fail, ``finishes=False``)."""
    worker_args = ["--mode", mode, "--recipe", recipe(tmp_path, checkpoints), "--checkpoints", checkpoints]
    worker_args += ["--every", str(EVERY), "--kill-after", str(KILL_AFTER)]
    out = torchrun.launch(
        WORKER, tmp_path, world, *worker_args, *args, tag=tag or mode, restarts=restarts, finishes=finishes
    )
    logs = [[json.loads(line) for line in (out / f"log_rank{r}.jsonl").read_text().splitlines()] for r in range(world)]
    if not finishes:
        return logs, None
    return logs, [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def steps_of(log, attempt):
    """{step: entry} of the batches one attempt trained, checking the steps run on without a gap."""
    entries = [e for e in log if "ids" in e and e["attempt"] == attempt]
    steps = [e["step"] for e in entries]
    assert steps == list(range(steps[0], steps[0] + len(steps))), steps
    return {e["step"]: e for e in entries}


def epoch_plans(*jobs, table="replicated"):
    """{epoch: sorted ids of its plan over all ranks}, checking that each rank logged the same
    plan in every attempt (and, under a replicated table, every rank the same one); each job's
    plan of an epoch over its ranks, the same in every job that logged that epoch."""
    plans: dict[int, list[int]] = {}
    for logs in jobs:
        per_rank: dict[int, dict[int, list[int]]] = {}
        for r, log in enumerate(logs):
            for e in log:
                if "plan" in e:
                    mine = per_rank.setdefault(e["plan"], {})
                    assert mine.setdefault(r, e["order"]) == e["order"], (r, e["plan"])  # the same after the restart
        for epoch, orders in per_rank.items():
            if table == "replicated":
                assert all(o == orders[0] for o in orders.values()), epoch
                whole = sorted(orders[0])
            elif orders[0] == orders.get(1) and len(orders) > 1:  # a plan resumed at another world size: every rank's
                whole = sorted(orders[0])
            else:
                whole = sorted(i for o in orders.values() for i in o)
            assert plans.setdefault(epoch, whole) == whole, epoch
    return plans


def check_restart(logs, results, gap=KILL_AFTER):
    """The checks both loaders share; returns each rank's final accounting (the first
    attempt up to the checkpoint, then the second attempt) and the checkpoint's step. ``gap``:
    steps rank 1 trained after the checkpoint the restart resumes from."""
    killed = [e for e in logs[1] if "killed" in e]
    assert len(killed) == 1, killed  # rank 1 died once, in the first attempt
    kill_step = killed[0]["killed"]
    assert all(r["attempt"] == 1 for r in results)  # the group finished in the restarted attempt
    ckpt = results[0]["resumed_from"]
    assert all(r["resumed_from"] == ckpt for r in results)  # every rank loaded the same step
    assert ckpt > 0 and ckpt % EVERY == 0 and kill_step - ckpt == gap
    assert results[0]["last_step"] == results[1]["last_step"]
    assert results[0]["params"] == results[1]["params"]  # DDP kept the ranks identical across the restart
    final = []
    for r, log in enumerate(logs):
        first, second = steps_of(log, 0), steps_of(log, 1)
        assert min(first) == 1 and min(second) == ckpt + 1  # nothing before the checkpoint was repeated
        assert max(second) == results[r]["last_step"]
        redone = [s for s in first if s > ckpt]
        assert redone, f"rank {r} trained nothing after the checkpoint before the kill"
        if r == 1:  # a rank killed inside its save trained that step, but the step was not logged
            assert redone == list(range(ckpt + 1, kill_step + 1 - bool(killed[0].get("in_save"))))
        for s in redone:  # retrained exactly: the same ids, in the same order, in the same epoch
            assert (second[s]["epoch"], second[s]["ids"]) == (first[s]["epoch"], first[s]["ids"]), (r, s)
        final.append([first[s] for s in sorted(first) if s <= ckpt] + [second[s] for s in sorted(second)])
    return final, ckpt, killed[0]


@pytest.mark.slow
# DCP with the replicated table only: the sharded table's restart at the same world size
# differs from it by nothing DCP sees (each rank's entry is restored as saved).
@pytest.mark.parametrize(
    ("table", "checkpoints"), [("replicated", "files"), ("sharded", "files"), ("replicated", "dcp")]
)
def test_epoch_sifting_survives_a_killed_rank(tmp_path, table, checkpoints):
    """320 samples, batches of 8 on 2 ranks, 4 epochs: warm-up (20 steps), two sifted epochs
    keeping half (10 steps each), annealing (20 steps); rank 1 dies at step 27, 3 steps
    after the checkpoint of step 24, in the first sifted epoch."""
    common = ["--epochs", "4", "--kill-epoch", "1", "--score-table", table]
    logs, results = launch(tmp_path, "epoch", *common, checkpoints=checkpoints)
    final, ckpt, killed = check_restart(logs, results)
    assert [e for e in logs[1] if e.get("step") == killed["killed"]][0]["kind"] == "sift"
    assert results[0]["last_step"] == 60
    plans = epoch_plans(logs, table=table)
    assert [len(plans[e]) for e in range(4)] == [320, 160, 160, 320]
    for epoch in range(4):
        trained = [i for rank in final for e in rank if e["epoch"] == epoch for i in e["ids"]]
        assert len(trained) == len(set(trained)), f"epoch {epoch}: a sample trained twice"
        assert sorted(trained) == plans[epoch], f"epoch {epoch}: trained != plan"


@pytest.mark.slow
@pytest.mark.parametrize("checkpoints", ["files", "dcp"])
def test_per_batch_sifting_survives_a_rank_killed_while_saving(tmp_path, checkpoints):
    """The kill and restart under ``SiftingDataloader``, with rank 1 killed inside its
    checkpoint of a step: with per-rank files, once rank 0 has written its own (the ranks'
    newest files differ); under DCP, before any rank's part is written (that checkpoint is
    never completed). The restart resumes both ranks from the step before, which both
    wrote; the resumed run re-emits exactly the batches after it, and the ranks still agree
    on every epoch's steps."""
    common = ["--epochs", "3", "--kill-epoch", "1", "--kill-in-save"]
    logs, results = launch(tmp_path, "per-batch", *common, checkpoints=checkpoints)
    final, ckpt, killed = check_restart(logs, results, gap=EVERY)
    assert killed["in_save"] and killed["epoch"] >= 1
    if checkpoints == "files":
        assert results[0]["on_disk"][-1] == ckpt + EVERY > results[1]["on_disk"][-1] == ckpt
    else:
        complete = [s for s, done in results[0]["on_disk"] if done]
        assert complete[-1] == ckpt and [ckpt + EVERY, True] not in results[0]["on_disk"]
    for epoch in range(3):
        per_rank = [sum(1 for e in rank if e["epoch"] == epoch) for rank in final]
        assert per_rank[0] == per_rank[1] > 0, (epoch, per_rank)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoints", ["files", "dcp"])
@pytest.mark.parametrize("table", ["replicated", "sharded"])
def test_epoch_sifting_resumes_a_killed_run_at_another_world_size(tmp_path, table, checkpoints):
    """The same kill with no restart allowed (the job fails, as when its nodes are gone),
    then a new job of 3 ranks on the same checkpoints: the recipe's ``load_checkpoint``
    finds the 2-rank checkpoint of step 24 and resumes from it at 3 ranks. The interrupted
    epoch trains exactly its plan, each sample once (the 2 ranks' steps up to the checkpoint,
    then the 3 ranks' rest); later epochs are planned for 3 ranks; the 3 ranks stay in step."""
    common = ["--epochs", "4", "--score-table", table]
    job = {"checkpoints": checkpoints}
    two, _ = launch(tmp_path, "epoch", *common, "--kill-epoch", "1", restarts=0, finishes=False, tag="two", **job)
    ckpts = str(tmp_path / "two" / "ckpts")
    three, results = launch(tmp_path, "epoch", *common, "--kill-epoch", "99", "--ckpts", ckpts, world=3, **job)
    assert all(r["resumed_from"] == 24 for r in results)
    assert all(r["params"] == results[0]["params"] for r in results)
    plans = epoch_plans(two, three, table=table)
    before = [e for log in two for e in log if "ids" in e and e["step"] <= 24]
    after = [e for log in three for e in log if "ids" in e]
    assert min(e["step"] for e in after) == 25  # nothing before the checkpoint again
    for epoch in range(1, 4):
        trained = [i for e in before + after if e["epoch"] == epoch for i in e["ids"]]
        assert len(trained) == len(set(trained)), f"epoch {epoch}: a sample trained twice"
        assert sorted(trained) == sorted(plans[epoch]), f"epoch {epoch}: trained != plan"
        steps = [sum(1 for e in log if "ids" in e and e["epoch"] == epoch) for log in three]
        assert len(set(steps)) == 1, (epoch, steps)  # lockstep
    assert [len(plans[e]) for e in range(4)] == [320, 160, 159, 318]  # epochs 2 and 3 planned for 3 ranks
