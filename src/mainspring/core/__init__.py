"""Mechanics every face shares: errors, events, alerts, leases, auth, wake-up loops, settings."""
