"""Models: ``loading`` (any causal LM by Hub id or local folder; save in HF layout), ``default`` (the
offline default: its tokenizer and tiny Llama), ``warmup`` (the default's supervised warm-up),
``fingerprint`` (the numbers that tell whether a built base matches ours) and ``tensor_files``
(safetensors written and read one tensor at a time). Open ``loading`` first.
"""
