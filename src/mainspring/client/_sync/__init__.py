# Generated from client/_async by scripts/sync_clients.py: edit that file, not this one.
"""The clients of every face, described once: ``client/_async`` is the source and ``client/_sync`` is
generated from it (``make sync-clients``). Edit ``_async``, never ``_sync``."""
