"""Stage functions called by the workflow scripts: read inputs, compute, write outputs atomically."""
