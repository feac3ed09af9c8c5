"""The pure core: no I/O, no printing, no catalog. Packages: :mod:`.sim` (the discrete-event
pipeline simulator and its schedule registry), :mod:`.costs` (FLOPs, kernels, collectives, the
mesh, context parallelism, experts), :mod:`.plan` (how a run is laid over the pipeline),
:mod:`.step` (the step-time models), :mod:`.memory`, :mod:`.explore`; :mod:`.specs`, :mod:`.units`
and :mod:`.errors` beneath them all."""
