"""Settings: the one table of knobs, config files and their validation."""
