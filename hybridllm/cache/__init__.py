"""The on-device semantic cache."""
