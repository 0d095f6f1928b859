"""Armature: distributed LLM inference serving."""

__version__ = "0.1.0"
__all__ = ["__version__"]
