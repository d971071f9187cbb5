"""Every committed sample is what its generator makes today: each is regenerated here and compared with the
committed file by digest (sha256 of the decompressed text), traces and truth files alike.

Regenerate them after changing the simulator or an emitter (CONTRIBUTING.md):
`python -m sample_traces.generate`, `python -m sample_traces.vllm_incident`,
`python -m sample_traces.sglang_incident`, `python -m sample_traces.basic`.
The only thing another environment may change, the OpenTelemetry SDK's version in the resource
(`telemetry.sdk.version`), is masked before hashing.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from sample_traces import basic, generate, sglang_incident, vllm_incident
from sample_traces.incidents import CATALOGUE

DATA = generate.DATA_DIR
_SDK_VERSION = re.compile(rb'("key":\s*"telemetry\.sdk\.version",\s*"value":\s*\{"stringValue":\s*)"[^"]*"')

#: name -> (what regenerates it into a directory, returning the files it wrote; the committed files)
Make = Callable[[Path], tuple[Path, ...]]
SAMPLES: dict[str, tuple[Make, tuple[Path, ...]]] = {
    **{inc.name: (partial(generate.generate_incident, inc.name),
                  (generate.traces_path(generate.INCIDENTS_DIR, inc.name),
                   generate.truth_path(generate.INCIDENTS_DIR, inc.name))) for inc in CATALOGUE},
    "demo": (lambda out: generate.generate_demo(out / generate.DEMO_TRACES.name, out / generate.DEMO_TRUTH.name),
             (generate.DEMO_TRACES, generate.DEMO_TRUTH)),
    "basic": (lambda out: (basic.generate(out / basic.DEFAULT_OUT.name),), (basic.DEFAULT_OUT,)),
    "vllm_slow_replica": (lambda out: vllm_incident.generate(out),
                          (vllm_incident.traces_path(), vllm_incident.truth_path())),
    "sglang_slow_replica": (lambda out: sglang_incident.generate(out),
                            (sglang_incident.traces_path(), sglang_incident.truth_path())),
}


def digest(path: Path) -> str:
    """sha256 of the file's text (decompressed when gzip), the SDK version masked."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return hashlib.sha256(_SDK_VERSION.sub(rb'\1"-"', data)).hexdigest()


def test_every_committed_sample_has_a_generator() -> None:
    committed = {p for p in DATA.rglob("*") if p.is_file()}
    covered = {p for _, paths in SAMPLES.values() for p in paths}
    assert committed == covered, f"committed without a generator here: {sorted(map(str, committed - covered))}"


def test_the_digest_masks_only_the_sdk_version(tmp_path: Path) -> None:
    line = b'{"key":"telemetry.sdk.version","value":{"stringValue":"1.40.0"}},{"key":"x","value":{"stringValue":"1"}}'
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(line)
    b.write_bytes(gzip.compress(line.replace(b"1.40.0", b"1.45.2")))
    c.write_bytes(line.replace(b'"1"}', b'"2"}'))
    assert digest(a) == digest(b) != digest(c)


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLES)
def test_the_committed_sample_is_what_its_generator_makes(name: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The regenerated text equals the committed text; written at gzip level 1, as the digest reads the text only
    (level 9, the committed files', takes about 0.3 CPU-s more per sample for the same text)."""
    monkeypatch.setattr(basic, "GZIP_LEVEL", 1)
    make, committed = SAMPLES[name]
    made = make(tmp_path)
    assert [p.name for p in made] == [p.name for p in committed]
    for new, old in zip(made, committed, strict=True):
        assert digest(new) == digest(old), f"{old.relative_to(DATA.parent)} differs from what its generator makes " \
                                           "now: regenerate the samples (module docstring)"
