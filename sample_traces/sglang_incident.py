"""The slow-replica incident written as SGLang writes it, for the accuracy suite.

Same run as sample_traces/vllm_incident.py (the catalogue's `slow_replica`: one of 32 replicas'
GPU throttled 6x in minutes 5 to 8). Each request that reached a replica becomes the root span
SGLang's tracer opens per request (sglang/srt/observability/trace.py: name " Req {rid[:8]}",
attributes `rid` and `module = sglang::request`, the `gen_ai.latency.*` / `gen_ai.usage.*`
attributes set at finish), as `tailscope collect` sees it when the slice spans arrive in other
export batches: root only, laid out from its attributes. Its resource is what `Resource.create`
builds in a pod given `OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=<pod>`: the SDK's keys, a random
service.instance.id (seeded here) and the pod name, which is the replica the operator knows.
Aborted requests carry `gen_ai.response.finish_reasons = '["abort"]'`.

    python -m sample_traces.sglang_incident [OUT_DIR]   # default: sample_traces/data/engines/
"""

from __future__ import annotations

import random
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from sample_traces.fleet import SimRequest, sim_ns
from sample_traces.generate import DURATION_S, RATE
from sample_traces.vllm_incident import replica_lines, write_incident

NAME = "sglang_slow_replica"
OUT_DIR = Path(__file__).parent / "data" / "engines"
SEED = 1
MODEL = "Qwen/Qwen2.5-7B-Instruct"
#: The OpenTelemetry Python SDK version the resources are written as.
SDK_VERSION = "1.45.2"


def traces_path(out_dir: Path = OUT_DIR) -> Path:
    """Where the SGLang-format traces go."""
    return out_dir / f"{NAME}.otlp.jsonl.gz"


def truth_path(out_dir: Path = OUT_DIR) -> Path:
    """Where the truth file goes."""
    return out_dir / f"{NAME}.truth.json"



def resource(pod: str, rng: random.Random) -> dict[str, AttributeValue]:
    """Resource.create({service.name: sglang}) with OTEL_RESOURCE_ATTRIBUTES=k8s.pod.name=<pod>."""
    return {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
            "telemetry.sdk.version": SDK_VERSION,
            "service.instance.id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "k8s.pod.name": pod, "service.name": "sglang"}


def root_span(req: SimRequest) -> tuple[int, int, dict[str, AttributeValue]]:
    """(start ns, end ns, attributes) of the root span SGLang writes for `req`."""
    start_s = req.at_replica_s
    done_s = min(req.decode_end_s, req.end_s) if req.status == "ok" else req.end_s
    rid = f"{req.index:016x}"
    attrs: dict[str, AttributeValue] = {
        "rid": rid, "module": "sglang::request", "gen_ai.request.id": rid, "gen_ai.response.model": MODEL,
        "gen_ai.usage.prompt_tokens": req.input_tokens, "gen_ai.usage.completion_tokens": req.output_tokens,
        "gen_ai.latency.e2e": done_s - start_s,
    }
    if req.gen_start_s >= start_s and req.gen_start_s <= req.first_token_s <= done_s:
        last = min(req.decode_end_s, done_s)
        attrs["gen_ai.latency.time_to_first_token"] = req.first_token_s - start_s
        # SGLang measures prefill from the end of dispatch: it includes the scheduler queue
        attrs["gen_ai.latency.time_in_model_prefill"] = req.first_token_s - start_s
        attrs["gen_ai.latency.time_in_model_decode"] = max(0.0, last - req.first_token_s)
        attrs["gen_ai.latency.time_in_model_inference"] = max(0.0, last - start_s)
    attrs["gen_ai.response.finish_reasons"] = '["stop"]' if req.status == "ok" else '["abort"]'
    return sim_ns(start_s), sim_ns(done_s), attrs


def _emit(tracer: trace.Tracer, req: SimRequest, _n: int, _rng: random.Random) -> None:
    start, end, attrs = root_span(req)
    tracer.start_span(f" Req {str(attrs['rid'])[:8]}", start_time=start, attributes=attrs).end(end_time=end)


def lines(requests: Sequence[SimRequest], seed: int = SEED) -> list[str]:
    """OTLP/JSON lines of every replica's root spans, made with the OpenTelemetry SDK."""
    per = replica_lines(requests, seed, resource=lambda _k, replica, rng: resource(replica, rng),
                        scope="sglang server", id_base=2000, emit=_emit)
    return [line for replica in per for line in replica]


def generate(out_dir: Path = OUT_DIR, seed: int = SEED, duration_s: float = DURATION_S,
             rate: float = RATE) -> tuple[Path, Path]:
    """Simulate the incident, write the SGLang-format traces and the truth file; returns both paths."""
    return write_incident(NAME, lines, title="Slow replica (throttled GPU), in SGLang's trace format",
                          fmt="SGLang request root spans with their gen_ai.latency attributes (OTLP/JSON lines)",
                          out_dir=out_dir, seed=seed, duration_s=duration_s, rate=rate)


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(path)
