"""ModelForge test suite."""
