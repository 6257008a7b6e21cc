"""Pure functions over tensors: advantages, losses, off-policy corrections."""
