"""The command line (`esqbe ...`), thin click commands over the Index facade."""
