"""Input: readers of every paper format, pre-encoded Parquet, sentence splitting."""
