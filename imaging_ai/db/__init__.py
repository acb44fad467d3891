"""Persistence: the typed models, the engine and the migrations."""
