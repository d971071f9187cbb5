"""The README's "Instrument your server" snippet runs as written and stores what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from analysis.engine.connect import connect
from tracing import schema as S

ROOT = Path(__file__).parents[2]


def _snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("<!-- instrument:begin -->", 1)[1].split("<!-- instrument:end -->", 1)[0]
    assert "## Instrument your server" in section
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section holds exactly one python snippet"
    return blocks[0]


def test_readme_snippet_runs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = tmp_path / "snippet.py"
    script.write_text(_snippet())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILSCOPE_")}
    env.update({"TAILSCOPE_STORE": str(store), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "p99_ms" in done.stdout
    con = connect(store)
    rows = con.execute("SELECT status, replica, model, input_tokens, output_tokens, ttft_ns > 0, tpot_ns > 0, "
                       "prefill_ns > 0, decode_ns > 0, queue_wait_ns > 0, preprocess_ns >= 0 FROM requests").fetchall()
    assert len(rows) == 20
    assert set(rows) == {("ok", "replica-0", "llama-3-8b", 6, 16, True, True, True, True, True, True)}
    stages = {r[0] for r in con.execute("SELECT DISTINCT Stage FROM spans WHERE Stage IS NOT NULL").fetchall()}
    assert stages == set(S.ALL_STAGES) - {"network", "model_load"}
