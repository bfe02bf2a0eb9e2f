"""The code location: ``defs`` for ``dg dev`` / ``dagster-daemon`` (see workspace.yaml).

The configuration comes from ``$DEADLINE_CONFIG``, else ``./deadlines.yaml``, else the bundled
examples; the store from ``$DEADLINE_DB_URL``, else the embedded SQLite file under ``$DEADLINE_HOME``.

The pipeline uses beta Dagster APIs on purpose (``multi_observable_source_asset``; Dagster's own
sensors pass the beta ``owners`` parameter), and Dagster prints a warning for each on every load of
the code location — a dozen identical lines per ``dg dev`` start that bury real problems. They are
silenced here, by category, for the code location process only.
"""

import warnings

import dagster as dg

for _category in (dg.BetaWarning, dg.PreviewWarning):
    warnings.filterwarnings("ignore", category=_category)

from deadline_pipeline.orchestration.build import build_definitions, default_config_path  # noqa: E402

defs = build_definitions(default_config_path())
