"""Mainspring: a durable processing server and Python library."""

from mainspring.app import App

__version__ = "0.1.0"
__all__ = ["App", "__version__"]
