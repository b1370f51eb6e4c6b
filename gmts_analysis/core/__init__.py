"""Formulas and their name lists: the logits shift, entropy and log-prob (tokens), the objective and omega, advantages, ranks, selections, seeds, the score registry."""
