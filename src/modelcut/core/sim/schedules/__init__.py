"""Pipeline schedule generators: pure functions (p devices, m micro-batches, v chunks) -> op lists.

Every generator returns a :class:`~modelcut.core.sim.ops.Schedule` and checks its own sizes;
none knows the engine. Stage numbering: stage s is the s-th chunk of layers in forward order.
Which schedules exist, and their traits, is the registry's (:mod:`modelcut.core.sim.registry`).
"""
