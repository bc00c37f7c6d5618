"""Small reference models for the built-in demos."""
