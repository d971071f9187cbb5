"""An example inference server instrumented with `tracing`, and a load generator.

    python -m examples.serve --port 8100 --replicas 2 --store ts-store
    python -m examples.loadgen --url http://127.0.0.1:8100 --url http://127.0.0.1:8101 -n 200

Each replica is a process with a real HTTP/1.1 server (asyncio), server-sent-event
streaming, an admission queue, a batching worker and a stand-in model whose prefill and
decode take real time proportional to tokens. Stdlib only, besides tailscope.
"""
