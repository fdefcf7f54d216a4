"""Workflows: durable Python functions on the machines face (API.md §5). A run is a machine of the workflow's
namespace, each recorded call one history event written by one version-fenced step."""
