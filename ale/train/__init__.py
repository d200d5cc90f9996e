"""ale.train."""
