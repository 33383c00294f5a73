"""Integrations with other training engines, imported lazily (never by the core)."""
