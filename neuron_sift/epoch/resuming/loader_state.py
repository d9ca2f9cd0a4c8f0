"""The epoch loader's state as the composition of its parts' states, and its restore.

Each part is a ``shared.state_parts.StatePart`` (``state_dict``, ``check_state``,
``load_state_dict``); ``EpochParts`` is one too, the loader's.

Why apart from the loader: the order of a restore matters (every part checks its own state
before any part changes; the plan in progress is restored before the shares, which may host
samples of it, and before the tables, which are sized for them), and it is the same for a
state of this run, of an older version, or one made at another world size.
"""

from dataclasses import dataclass
from typing import Any

from neuron_sift.epoch.planning.planner import EpochPlanner
from neuron_sift.epoch.resuming.state_layout import FORMAT, SharesCheck, check_rank_state
from neuron_sift.epoch.running.history import EpochHistory
from neuron_sift.epoch.running.opening import EpochOpener
from neuron_sift.epoch.running.pairing import PairingQueue
from neuron_sift.epoch.running.progress import EpochProgress
from neuron_sift.epoch.scores.owned_shares import OwnedShares
from neuron_sift.epoch.scores.rank_shares import RankShares
from neuron_sift.epoch.scores.tables import ScoreTables
from neuron_sift.epoch.selection.guard import NoiseGuard
from neuron_sift.epoch.selection.start_rule import StartRule
from neuron_sift.shared.state_parts import StatePart


@dataclass(frozen=True)
class EpochParts:
    """The parts whose states make the epoch loader's (``state_layout.py`` names each)."""

    planner: EpochPlanner
    progress: EpochProgress
    tables: ScoreTables
    shares: RankShares | OwnedShares
    guard: NoiseGuard
    start: StartRule
    pairing: PairingQueue
    history: EpochHistory
    opener: EpochOpener
    check_shares: SharesCheck

    def parts(self) -> dict[str, StatePart]:
        """Each part by its name in the state, in the state's order."""
        return {
            "planner": self.planner,
            "progress": self.progress,
            "tables": self.tables,
            "shares": self.shares,
            "guard": self.guard,
            "start": self.start,
            "pairing": self.pairing,
            "history": self.history,
        }

    def state_dict(self) -> dict[str, Any]:
        states = {name: part.state_dict() for name, part in self.parts().items()}
        return FORMAT.write({"in_progress": states["progress"]["in_progress"], **states})

    def check_state(self, state: dict[str, Any]) -> None:
        """Refuse a state this loader cannot restore (every part's check); changes nothing."""
        self._check(FORMAT.read(state))

    def _check(self, state: dict[str, Any]) -> None:
        check_rank_state(state, self.planner, self.check_shares)  # every part's, before any part changes

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = FORMAT.read(state)
        self._check(state)
        self.planner.load_state_dict(state["planner"])
        self.progress.load_state_dict(state["progress"])
        self.shares.load_state_dict(state["shares"], self.progress.plan)  # sharded: hosts the plan's guests
        self.tables.resize(self.planner.table_size)
        self.tables.load_state_dict(state["tables"])
        self.opener.restore(self.progress.plan, self.progress.current_epoch)
        self.guard.load_state_dict(state["guard"])
        self.start.load_state_dict(state["start"])
        self.pairing.load_state_dict(state["pairing"])
        self.history.load_state_dict(state["history"])
