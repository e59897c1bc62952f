"""Seeds-only Evolution Strategies: the loop, the interface to what holds the weights, the weight math,
the settings and the two backends.

Open ``loop`` first (``train_es``: one iteration from member seeds to the update, metrics and
checkpoints). ``ops`` is the weight math every backend shares (member seeds, fitness shaping, the
update ``alpha / N * sum_n w_n eps_n``); the noise itself is ``esgrpo.noise``, below the engines that
also use it. ``backend`` is the interface the loop talks to (the loop never imports vLLM);
``hf_backend`` keeps theta in this process and scores members with the population engine,
``vllm_backend`` perturbs the weights inside vLLM workers (``vllm_worker``: what each worker runs). ``settings`` is ``ESConfig``, every setting
of a run, documented where it is declared. Changing ES touches nothing under ``esgrpo.grpo``.
"""
