"""The watch stage."""
