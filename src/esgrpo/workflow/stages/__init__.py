"""Stage functions called by the workflow scripts through ``esgrpo.workflow.bridge.run_stage``: read
inputs, compute, write outputs atomically. One module per rule family: ``data``, ``models``,
``training``, ``evaluation``, ``analysis``, ``theory``."""
