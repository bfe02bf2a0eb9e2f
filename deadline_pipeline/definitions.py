"""The code location: ``defs`` for ``dagster dev`` / ``dagster-daemon`` (see workspace.yaml).

The configuration comes from ``$DEADLINE_CONFIG``, else ``./deadlines.yaml``, else the bundled
examples; the store from ``$DEADLINE_DB_URL``, else the embedded SQLite file under ``$DEADLINE_HOME``.
"""

from deadline_pipeline.orchestration.build import build_definitions, default_config_path

defs = build_definitions(default_config_path())
