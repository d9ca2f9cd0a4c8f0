"""The sifting engine: the state and the per-batch selection step (on the device, or on
the host for a CPU model).

Kept apart from the loader (iteration, accumulation, delivery) and from the backends
(device, sync, host reads) so that new selection policies slot in without touching them.
"""
