"""The batching face."""
