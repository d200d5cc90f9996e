"""ale.sandbox."""
