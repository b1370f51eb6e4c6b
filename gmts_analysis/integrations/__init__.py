"""Training frameworks: the TRL trainer drop-in, the verl recipe, rollout logging and live selection diagnostics."""
