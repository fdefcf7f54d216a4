"""The machines face."""
