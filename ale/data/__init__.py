"""ale.data."""
