"""Batch runs over model collections (stan-dev/example-models, posteriordb): discovering models
and their data, and reading the data formats they ship (issue P2-2)."""
