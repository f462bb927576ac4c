"""Trainyard."""
