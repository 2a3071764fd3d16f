"""A run's records on disk: the run folder, its records, checkpoints, and reading them back."""
