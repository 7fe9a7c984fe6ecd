"""The query pipeline: first stage request, rescoring, centring, cited text identification."""
