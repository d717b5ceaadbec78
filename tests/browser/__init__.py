"""browser tier."""
