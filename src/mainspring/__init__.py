"""Mainspring: a durable processing server and Python library."""

__version__ = "0.1.0"
