"""lightning-loadguard: what limits your training, measured."""
