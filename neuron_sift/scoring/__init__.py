"""Scoring shared by both modes: the no-grad forward, reference-loss tables, cheaper scorers."""
