"""The catalogs shipped with modelcut: hardware, models, training-stack presets, fitted profiles and
published runs (TOML package data, every figure with its source), and models read from Hugging
Face ``config.json`` files. The catalog imports only the core.

>>> hardware("a100").name
'a100-sxm4-80gb'
"""

from __future__ import annotations

from .framework_rules import capabilities
from .frameworks import default_framework, framework, framework_names
from .hardware import all_hardware, cappable_keys, hardware, hardware_keys
from .hf_config import model_from_hf_config
from .models import all_models, load_hf_config, model, model_keys
from .profiles import Profile, all_profiles, load_profile, profile_for
from .runs import PublishedRun, RunSettings, apply_settings, published_run, published_runs, run_settings
from .tables import LAYOUT_KEYS, MODEL_KEYS, TRAINING_KEYS, layout_from_table, model_from_table, training_from_table

__all__ = ["hardware", "all_hardware", "cappable_keys", "hardware_keys", "model", "all_models", "model_keys", "published_runs", "published_run",
           "model_from_hf_config", "load_hf_config", "model_from_table", "layout_from_table",
           "training_from_table", "PublishedRun", "RunSettings", "run_settings", "apply_settings",
           "MODEL_KEYS", "LAYOUT_KEYS", "TRAINING_KEYS", "framework", "framework_names", "capabilities", "default_framework",
           "Profile", "all_profiles", "load_profile", "profile_for"]
