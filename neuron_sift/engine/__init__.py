"""The sifting engine: device-resident state and the per-batch selection step.

Kept apart from the loader (iteration, accumulation, delivery) and from the backends
(device, sync, host reads) so that new selection policies slot in without touching them.
"""
