"""The request model and the embedded engine it runs on.

`model` generates the one request model's SQL per dialect; `views` names the documented views
(`spans`, `requests`, `stages`); `connect` opens a DuckDB connection over a segment store;
`sandbox` is the read-only connection the dashboard's SQL page and `tailscope sql` use;
`materialize` writes the per-hour requests; `percentiles` owns the percentile convention and
its SQL. Nothing here knows about spikes, reports or any other product.
"""
