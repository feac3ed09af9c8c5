"""modelcut: cut a large model across many accelerators and see what it costs.

Layers, each importing only those below it (docs/architecture.md):

* ``modelcut.core``: the pure core: the pipeline simulator and its schedule registry, the pipeline
  plan, the costs (FLOPs, kernels, collectives, mesh, context parallelism, experts), the step
  models, memory and the layout explorer. No I/O, no catalog; constants are passed in.
* ``modelcut.catalog``: data files with their sources (hardware, models, framework presets, fitted
  profiles, published runs) and their loaders.
* ``modelcut.analysis``: validation and calibration against published runs; the torch cross-check.
* ``modelcut.service``: the use cases the faces call, with documented JSON.
* Faces: ``modelcut.cli``, ``modelcut.web`` and ``modelcut.export`` (formats and exporters).
"""

__version__ = "0.1.0"
