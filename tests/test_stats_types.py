"""stats.json as typed objects (gmts_analysis.analysis.stats_types): same text back, older files read."""

import json
import math

import pytest

from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.resources import example_run_dir

OPTIONAL = ("uncertain", "paired_difference", "paired_leader", "mass_capture", "mass_capture_ci", "by_construction",
            "by_domain", "by_step")


def shipped() -> str:
    return (example_run_dir() / "stats.json").read_text(encoding="utf-8")


def test_read_and_write_give_the_same_text():
    text = shipped()
    st = Statistics.from_json(text)
    assert st.to_json() == text
    d = json.loads(text)
    assert list(st.to_dict()) == list(d) and list(st.to_dict()["by_domain"]) == list(d["by_domain"])
    # attributes are the file's values
    assert st.meta.rho_key == d["meta"]["rho"] and st.meta.estimators == d["meta"]["estimators"]
    assert st.cross_answer["gmts"].spearman == d["cross_answer"]["gmts"]["spearman"]
    assert st.topk_overlap.at("batch", "entropy", "0.2") == d["topk_overlap"]["batch"]["entropy"]["0.2"]
    iv = st.mass_capture_ci.at("group", "gmts", "0.05")
    assert (iv.ci_low, iv.ci_high) == tuple(d["mass_capture_ci"]["group"]["gmts"]["0.05"].values())
    assert st.within_group["entropy"].n_groups == d["within_group"]["entropy"]["n_groups"]
    assert not st.within_group["entropy"].has("n_answers") and st.within_answer["entropy"].has("n_answers")
    assert st.uncertain.n_tokens == d["uncertain"]["n_tokens"] and not st.uncertain.has("zero_advantage")
    assert {e["key"] for e in d["by_construction"]} == st.fixed


def test_an_older_file_reads_with_its_blocks_absent_and_writes_back_without_them():
    d = {k: v for k, v in json.loads(shipped()).items() if k not in OPTIONAL}
    d["meta"] = {k: v for k, v in d["meta"].items() if k not in ("rho", "uncertain_below")}
    d["cross_answer"]["entropy"]["ci_low"] = None  # undefined statistic: null
    st = Statistics.from_dict(d)
    assert st.uncertain is None and st.by_domain == {} and not st.mass_capture and st.fixed == set()
    assert st.paired_difference.get("within_answer", "gmts", "entropy") is None
    assert st.rho_key == "0.2" and st.meta.uncertain_below is None
    assert math.isnan(st.cross_answer["entropy"].ci_low)
    assert json.loads(st.to_json()) == d
    assert Statistics.from_dict({}).to_dict() == {} and not Statistics.from_dict({}).zero_advantage


def test_unknown_keys_are_kept_and_bad_values_name_the_field():
    d = json.loads(shipped())
    d["cross_answer"]["gmts"]["new_statistic"] = 1.5
    d["later_block"] = {"x": 1}
    back = Statistics.from_dict(d).to_dict()
    assert back["cross_answer"]["gmts"]["new_statistic"] == 1.5 and back["later_block"] == {"x": 1}
    d["cross_answer"]["gmts"]["spearman"] = "high"
    with pytest.raises(GmtsError, match=r"cross_answer\.gmts\.spearman"):
        Statistics.from_dict(d)
    with pytest.raises(GmtsError, match="within_answer"):
        Statistics.from_dict({"within_answer": [1, 2]})


def test_run_statistics_is_the_typed_view_of_run_stats():
    import gmts_analysis as gmts

    run = gmts.load_run(example_run_dir())
    assert isinstance(run.stats, dict)
    assert run.statistics.to_json() == shipped() and run.statistics.rho_key == run.stats["meta"]["rho"]


def test_run_statistics_is_built_once_per_stats_dict(monkeypatch):
    import gmts_analysis as gmts
    from gmts_analysis.analysis import stats_types

    run = gmts.load_run(example_run_dir())
    built = []
    coerce = stats_types.Statistics.coerce.__func__
    monkeypatch.setattr(stats_types.Statistics, "coerce",
                        classmethod(lambda cls, x: built.append(1) or coerce(cls, x)))
    first = run.statistics
    assert run.statistics is first and len(built) == 1  # parsed once, not on every access
    run.stats = {**run.stats, "meta": {**run.stats["meta"], "rho": "0.05"}}  # a new dict: built again
    assert run.statistics is not first and run.statistics.rho_key == "0.05" and len(built) == 2
