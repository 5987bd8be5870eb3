"""phaselens analytics."""
