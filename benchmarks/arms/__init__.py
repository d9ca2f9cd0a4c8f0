"""The arms: the registry, and the plug-in modules listed in ``PLUGINS`` that register into it."""

from benchmarks.arms import dynamic_random, epoch, frontier, infobatch, per_batch, selective_backprop, seta, single_pass
from benchmarks.arms.registry import ARMS, ArmSpec, default_arms, get_arm, register, task_arms

# Every plug-in, listed (never found by a file pattern): each has ``register_arms(register)``,
# called once, in this order, which is the order of the registry and of the default arms.
PLUGINS = (frontier, per_batch, infobatch, epoch, dynamic_random, seta, single_pass, selective_backprop)

for _plugin in PLUGINS:
    _plugin.register_arms(register)

__all__ = ["ARMS", "PLUGINS", "ArmSpec", "default_arms", "get_arm", "register", "task_arms"]
