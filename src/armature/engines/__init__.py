"""Adapters that put third-party engines behind our Engine contract (engine/interface.py)."""
