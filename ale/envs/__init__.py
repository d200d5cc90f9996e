"""ale.envs."""
