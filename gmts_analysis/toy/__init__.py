"""Toy verifiable domains, a character tokenizer, training and sampling of small policies."""
