"""Encoding spread over a cluster (Ray Data): `ray_encode` (an optional extra, `pip install 'esqbe[ray]'`)."""
from .raydata import RAY_HINT, RayJobError, RayNotInstalledError, ray_encode

__all__ = ["ray_encode", "RayNotInstalledError", "RayJobError", "RAY_HINT"]
