"""The planner's state check: a checkpoint of another rank layout or setup is refused before
anything is loaded, naming the setting (the state is the run's identity: ``run_identity.py``).

Why the rank layout first, and pointing to ``load_state_dict_from_ranks``: a user who
resumes a data-parallel run on another number of ranks reaches for ``load_state_dict``
with one rank's state; the message says where such a state goes instead. Kept apart from
``planning/plan_checks.py`` (which reads plans) so that the planner, which every other part
imports, imports nothing of theirs.
"""

from dataclasses import asdict
from typing import Any

from neuron_sift.epoch.planning.run_identity import REQUIRED, SUPPORT, RunIdentity, stated
from neuron_sift.shared.logs import MASK63
from neuron_sift.shared.state_checks import need_int, need_mapping


def check_planner_state(identity: RunIdentity, state: Any) -> None:
    """Refuse a planner state (``EpochPlanner.state_dict()``) that the planner of the run
    ``identity`` cannot load: of another rank layout or setup (a state without a support was
    taken over all samples). Its seed is any non-negative int64: the planner takes it."""
    need_mapping(state, "planner", REQUIRED)
    world = need_int(state["world_size"], "planner.world_size", 1)
    rank = need_int(state["rank"], "planner.rank", 0)
    if (world, rank) != (identity.world_size, identity.rank):
        raise ValueError(
            f"checkpoint has world_size={world}, rank={rank} but this loader has world_size={identity.world_size}, "
            f"rank={identity.rank}: load_state_dict() loads each rank's own state at the world size it was taken "
            "at; to resume at another world size (or from another rank's state), pass every rank's state_dict() "
            "of the run to load_state_dict_from_ranks(states)"
        )
    need_int(state["seed"], "planner.seed", 0, MASK63, "a non-negative int64")
    for key, mine in asdict(identity).items():
        theirs = stated(state, key)
        if key != "seed" and key not in SUPPORT and theirs != mine:
            raise ValueError(f"checkpoint has {key}={theirs!r} but this loader has {mine!r}")
    theirs = (state.get("support_size", state["n"]), state.get("support_crc32"))
    mine = (identity.n if identity.support_size is None else identity.support_size, identity.support_crc32)
    if theirs != mine:
        raise ValueError(
            f"checkpoint was taken with a sampler over {theirs[0]} samples "
            f"({'all' if theirs[1] is None else 'a subset'} of {state['n']}) but this loader's sampler yields "
            f"{mine[0]} ({'all' if mine[1] is None else 'a subset'}; checksum {mine[1]} vs {theirs[1]}): "
            "resume with the sampler the checkpoint was taken with"
        )
