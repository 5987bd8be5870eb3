"""phaselens collector."""
