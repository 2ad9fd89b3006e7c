"""Shared helpers for the test suite (importable as ``tests.support``)."""
