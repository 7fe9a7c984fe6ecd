"""Second stage: rescorers over sentence vectors, their declared parameters (the registry), word statistics."""
