"""The configurations the README and docs/configuration.md show are valid: a newcomer copies them
first, and a key renamed in the model would otherwise leave them refused with no test noticing."""

from __future__ import annotations

from pathlib import Path

import pytest

from deadline_pipeline.config import load_config

REPO = Path(__file__).resolve().parents[1]


def _yaml_block(path: Path, after: str) -> str:
    text = path.read_text()
    return text.split(after, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("doc, heading", [
    ("README.md", "## Your own configuration"),
    ("docs/configuration.md", "A complete one"),
])
def test_documented_configuration_loads(tmp_path, doc, heading):
    (tmp_path / "deadlines.yaml").write_text(_yaml_block(REPO / doc, heading))
    (tmp_path / "subscribers.csv").write_text(
        "id,tenant,email,webhook_url,timezone\nu1,acme,ada@example.org,,Europe/Berlin\n")
    cfg, path = load_config(tmp_path / "deadlines.yaml")
    assert path == tmp_path / "deadlines.yaml"
    assert [s.name for s in cfg.subscriptions] == ["paper-deadlines"]
    assert [s.name for s in cfg.sources] == ["conferences"]
