"""ale.agents."""
