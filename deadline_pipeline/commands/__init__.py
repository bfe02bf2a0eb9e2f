"""Sub-commands of ``deadline-pipeline``, one module per stage.

Each module listed here defines ``register(main: click.Group) -> None`` that adds its commands.
"""

COMMAND_MODULES: list[str] = [
    "deadline_pipeline.commands.ops_cmds",
    "deadline_pipeline.commands.ingest_cmds",
    "deadline_pipeline.commands.time_cmds",
    "deadline_pipeline.commands.plan_cmds",
    "deadline_pipeline.commands.alert_cmds",
]
