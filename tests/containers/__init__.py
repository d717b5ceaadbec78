"""containers tier."""
