"""Tests of bertfuse.ops: one file per op module (test_<module>.py), ORT CPU vs reference."""
