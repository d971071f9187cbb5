"""Compaction and retention of a segment store (`tailscope compact`, and in the background of `tailscope collect`).

`merge` merges an hour's segments in levels into a few large sorted files, atomically for
readers (tracing.store.list_hour hides merged segments); `retention` removes whole hours,
oldest first. docs/collect.md, "What happens to files", tells the whole story.
"""
