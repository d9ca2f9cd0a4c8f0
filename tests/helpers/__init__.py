"""Helpers shared by tests of several packages (each module says what it stands in for)."""
