"""The orchestration stage."""
