"""The operators' dashboard at ``/ui``: server-rendered pages over the faces' services."""
