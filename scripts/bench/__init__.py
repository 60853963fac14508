"""The multi-worker benchmark, ``python -m scripts.bench``: one module per section, shared helpers beside them.

figures (numbers, tables), proc (/proc readings), processes (started and stopped by PID), servers (configs,
checkouts, cookies' owners), client and driving (episodes and runs), haproxy, then the sections: episodes,
hop, memory, cpu_scale, startup; targets judges them; server is the benchmark's own server.
"""
