"""The deliver stage."""
