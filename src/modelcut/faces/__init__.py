"""Faces: turn core results into text, JSON, traces, plots and HTML. No formulas here."""
