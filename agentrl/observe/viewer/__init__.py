"""The trajectory viewer: records read from samples.jsonl and the static HTML page."""
