"""ale.models."""
