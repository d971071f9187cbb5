"""tailscope intake: traces into the store.

OTLP decoding (`intake.otlp`, with the optional C decoder `intake._otlpx`), the OTLP
receiver behind `tailscope collect` (`intake.collect`), file ingest behind `tailscope ingest`
(`intake.ingest`) and the engine trace mappings (`intake.engines`: vLLM, SGLang, TGI, Triton).
Imports `tracing` (schema, rows, store) and nothing else of tailscope.
"""
