"""Tests of bertfuse.passes: one file per pass module (test_<module>.py)."""
