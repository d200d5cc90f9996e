"""ale.ipa."""
