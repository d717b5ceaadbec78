"""llama tier."""
