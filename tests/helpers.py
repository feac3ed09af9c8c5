"""Shorthands the tests share: the registry's names by trait, and the two step models with the
constants the service would pass (the seed's fitted η; the shipped profile and a preset)."""

from __future__ import annotations

from modelcut import catalog
from modelcut.analysis.validation import seed_eta
from modelcut.core.sim import registry
from modelcut.core.step import default, seed

ALL_SCHEDULES = registry.names()
#: Schedules without overlapped units (an action CSV can carry them).
SCHEDULES = tuple(n for n, s in registry.SCHEDULES.items() if not s.overlapped)
OVERLAPPED = tuple(n for n, s in registry.SCHEDULES.items() if s.overlapped)
DEFAULT_CHUNKS = {n: s.default_chunks for n, s in registry.SCHEDULES.items()}


def predict_seed(run, hw, eta=None, force_simulation=False):
    """The seed model with η fitted on the deck's calibration run unless given."""
    return seed.predict(run, hw, seed_eta() if eta is None else eta, force_simulation)


def predict_default(run, hw, eff=None, framework=None, overlap=None):
    """The default model: ``eff`` (default: the shipped profile), ``framework`` a preset name or
    object (default: the default preset), ``overlap`` overrides."""
    eff = eff if eff is not None else catalog.profile_for(hw).efficiency
    fw = framework if hasattr(framework, "overlap") else catalog.framework(framework)
    return default.predict(run, hw, eff, fw.with_overlap(overlap))


def assert_partial_beats_full(ex, variant: str) -> None:
    """Each layout of an exploration that fits under a partial recomputation ``variant`` (blocks,
    every) runs faster than the same layout with every layer recomputed, and needs no less memory:
    it redoes a subset of full recomputation's work."""
    full = {(e.structure, e.zero): e for e in ex.layouts if e.recompute == "full"}
    pairs = [(e, full[(e.structure, e.zero)]) for e in ex.layouts
             if e.recompute == variant and (e.structure, e.zero) in full]
    assert pairs
    for part, f in pairs:
        assert part.step_time_s < f.step_time_s and part.peak_bytes >= f.peak_bytes


class FlatStep:
    """A stand-in step time, every layout 1 s, for explorations whose memory search alone is under test."""

    step_time_s = 1.0


def assert_round_trip(command: str, emitted: str, req, framework, tmp_path, capsys) -> float:
    """``modelcut <command>`` (from-megatron, from-torchtitan) reads ``emitted`` (an ``explore
    --emit`` of one of ``req``'s layouts, searched on ``framework``) into a RUN.toml that
    ``predict`` reads; its step time, seconds."""
    import json
    from modelcut.cli import main
    f, out = tmp_path / "emitted", tmp_path / "run.toml"
    f.write_text(emitted)
    assert main([command, str(f), "--gpu", req.hw.name, "--gpus", str(req.gpus), "--model", req.model.name,
                 "--framework", framework.name, "-o", str(out)]) == 0
    assert main(["predict", str(out), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["step_time_s"]
