"""The parsers' limits on hostile payloads: re-exported from the leaf module
:mod:`deadline_pipeline.limits`, which the configuration shares without importing the ingest stage."""

from deadline_pipeline.limits import (
    MAX_CSV_ROWS,
    MAX_DEPTH,
    MAX_EXPANDED_NODES,
    ParseError,
    RepeatedKey,
    SafeLoader,
    check_json_depth,
    load_yaml,
    repeated_keys,
)

__all__ = ["MAX_CSV_ROWS", "MAX_DEPTH", "MAX_EXPANDED_NODES", "ParseError", "RepeatedKey", "SafeLoader",
           "check_json_depth", "load_yaml", "repeated_keys"]
