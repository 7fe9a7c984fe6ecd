"""Fakes the tests share (no engine, no network beyond loopback): see each module."""
