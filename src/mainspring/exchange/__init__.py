"""The exchange face."""
