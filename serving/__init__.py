"""phaselens serving."""
