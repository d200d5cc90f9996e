"""ale.rollout."""
