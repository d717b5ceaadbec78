"""e2e tier."""
