"""Pure data types shared across layers (the lowest layer: imports nothing from armature)."""
