"""Benchmarks of acp_channels against the official ACP SDK servers (see bench/README.md)."""
