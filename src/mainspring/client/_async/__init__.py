"""The clients of every face, described once: ``client/_async`` is the source and ``client/_sync`` is
generated from it (``make sync-clients``). Edit ``_async``, never ``_sync``."""
