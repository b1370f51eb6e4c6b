"""From a run's tables to numbers: statistics (stats.json), the summary sentences, token strings, the in-memory run (runs)."""
