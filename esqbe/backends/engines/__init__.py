"""Elasticsearch and OpenSearch backends, and attaching esqbe to an index a user owns."""
