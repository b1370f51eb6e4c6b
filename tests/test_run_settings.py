"""Old runs' defaults in one place (issue 29): RunSettings reads manifest.json's config with the
declared default for every field an older run did not record; one chunk-size parser."""

from __future__ import annotations

import pytest

from gmts_analysis.errors import GmtsError


def test_run_settings_apply_the_declared_defaults():
    from gmts_analysis.core.vocabulary import DEFAULT_RHO, DEFAULT_UNCERTAIN_BELOW
    from gmts_analysis.options.settings import RunSettings

    old = RunSettings.from_manifest({"config": {"temperature": 0.7, "seed": 3}})  # a run before --rho existed
    assert (old.rho, old.uncertain_below, old.temperature, old.seed) == (DEFAULT_RHO, DEFAULT_UNCERTAIN_BELOW, 0.7, 3)
    for bad in (None, {}, {"config": None}, {"config": {"rho": "x", "uncertain_below": True}}, []):
        s = RunSettings.from_manifest(bad)
        assert (s.rho, s.uncertain_below) == (DEFAULT_RHO, DEFAULT_UNCERTAIN_BELOW)
    new = RunSettings.from_manifest({"config": {"rho": 0.1, "uncertain_below": 1, "loss_type": "dr_grpo",
                                                "max_len": None, "unknown_later_field": 1}})
    assert (new.rho, new.uncertain_below, new.loss_type, new.max_len) == (0.1, 1.0, "dr_grpo", None)
    assert isinstance(new.uncertain_below, float)


def test_the_shipped_run_settings():
    from pathlib import Path

    from gmts_analysis.options.settings import RunSettings
    from gmts_analysis.util.io import read_json_object

    root = Path(__file__).resolve().parent.parent / "data" / "example_run"
    m = read_json_object(root / "manifest.json")
    s = RunSettings.from_manifest(m)
    assert s.rho == m["config"]["rho"] and s.seed == m["config"]["seed"]


@pytest.mark.parametrize("value,expected", [(None, "auto"), ("auto", "auto"), ("16", 16), (8, 8), (4.0, 4)])
def test_chunk_size_parsed_once(value, expected):
    from gmts_analysis.core.sizes import parse_chunk_size

    assert parse_chunk_size(value) == expected


@pytest.mark.parametrize("value,match", [("x", "expected an integer or 'auto'"), ("0", "must be an integer >= 1"),
                                         (2.5, "expected an integer"), (True, "expected an integer")])
def test_chunk_size_refused_naming_the_flag(value, match):
    from gmts_analysis.core.sizes import parse_chunk_size
    from gmts_analysis.options.config import ProbeOptions
    from gmts_analysis.probing.settings import EngineSettings
    from gmts_analysis.probing.validate import validate_options

    with pytest.raises(GmtsError, match="^--chunk-size: " + match):
        parse_chunk_size(value)
    with pytest.raises(GmtsError, match="^--chunk-size: " + match):
        validate_options(ProbeOptions(chunk_size=value))
    with pytest.raises(GmtsError, match="^--chunk-size: " + match):
        EngineSettings.of(ProbeOptions(chunk_size=value))
