"""The interactions face."""
