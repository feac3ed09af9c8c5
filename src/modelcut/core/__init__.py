"""The pure core: no I/O, no printing."""
