"""ale.inference."""
