"""Rollout engines: one generation interface, ``generate(rows, n, temperature, top_p, max_new_tokens,
seed) -> Rollouts``, and every engine that implements it.

Open ``rollout`` first: ``Rollouts``, ``prompt_texts`` (rows -> chat-formatted prompts) and
``HFEngine`` (transformers ``generate``). ``population`` is the ES population-batched forward (N
perturbed members in one forward per step, full-rank or low-rank) over the layouts of ``population_weights``
(``member_values``: the members' values from theta and the seeds; ``panel_matmul``: the CPU kernel for
per-member matrices; ``groups``: how many full-rank members at once);
``local`` chooses between the two for a model in this process. ``vllm_engine`` is the vLLM engine
(optional extra) and ``vllm_layout`` maps vLLM's fused weight layout to the HF tensor names.
Engines take a loaded model; they never load one (``esgrpo.models``) or train one.
"""
