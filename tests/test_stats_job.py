"""gmts stats's job (run/stats_job.py): typed settings that check their own fields once, at construction."""

from __future__ import annotations

import pytest

from gmts_analysis.commands.stats import COMMAND
from gmts_analysis.errors import GmtsError
from gmts_analysis.run.stats_job import RescoreSettings, StatsOutput, StatsSettings, run_stats


@pytest.mark.parametrize("kw, needle", [({"n_boot": -1}, "--n-boot"), ({"rho": 0.0}, "--rho"),
                                        ({"rho": 1.5}, "--rho"), ({"uncertain_below": 2.0}, "--uncertain-below")])
def test_stats_settings_check_their_domains(kw, needle):
    with pytest.raises(GmtsError, match=needle):
        StatsSettings(**kw)


def test_rescore_is_asked_by_any_new_reward():
    assert not RescoreSettings().asked
    assert RescoreSettings(mask_truncated_completions=True).asked and RescoreSettings(verifier="math").asked


def test_the_command_calls_one_job_function():
    assert COMMAND.function() is run_stats
    assert COMMAND.settings[:3] == (StatsSettings, RescoreSettings, StatsOutput)
