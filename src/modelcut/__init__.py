"""modelcut: cut a large model across many accelerators and see what it costs.

Pure core (``modelcut.core``): pipeline schedules, the discrete-event engine, the
FLOP/communication/memory models, the step-time model and the layout explorer.
Faces (``modelcut.cli``, ``modelcut.web``, ``modelcut.faces``): thin layers that do I/O.
"""

__version__ = "0.1.0"
