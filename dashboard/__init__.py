"""phaselens dashboard."""
