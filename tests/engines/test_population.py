"""Population-batched generation against transformers' own generate and forward."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Imported at collection: the first import of transformers takes seconds, not a test's time.
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from esgrpo.engines import groups, panel_matmul  # noqa: E402
from esgrpo.engines import population as pop  # noqa: E402
from esgrpo.engines import population_weights as pw_module  # noqa: E402
from esgrpo.engines.member_values import MemberValues  # noqa: E402
from esgrpo.engines.population import (  # noqa: E402
    PopulationWeights,
    population_generate,
    prepare_population,
    sequential_generate,
    stack_members,
)
from esgrpo.noise import Noise, Population  # noqa: E402

torch.set_num_threads(1)

VOCAB, PAD, N_MEMBERS, NEW = 64, 0, 3, 10


def tiny_model(tie: bool, kind: str = "llama", seed: int = 0) -> torch.nn.Module:
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=tie,
                  max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=PAD,
                  # A wider init than 0.02 keeps top-2 logit gaps far above float rounding, so an
                  # argmax cannot flip between two correct implementations on a near-tie.
                  initializer_range=0.2)
    torch.manual_seed(seed)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()


def perturbed(model: torch.nn.Module, n: int = N_MEMBERS, sigma: float = 0.05, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: p.detach()[None] + sigma * torch.randn((n, *p.shape), generator=g)
            for name, p in model.named_parameters()}


def left_padded(pads=(0, 2, 5, 1), length: int = 7, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(pads), length), generator=g)
    mask = torch.ones_like(ids)
    for b, k in enumerate(pads):
        ids[b, :k], mask[b, :k] = PAD, 0
    return ids, mask


def assert_same(a: pop.PopulationOutput, b: pop.PopulationOutput, tol: float = 1e-4) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=tol, rtol=0)
    torch.testing.assert_close(a.entropies, b.entropies, atol=tol, rtol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_greedy_tokens_equal_one_generate_call_per_member(tie):
    model = tiny_model(tie)
    stacked = perturbed(model)
    ids, mask = left_padded()
    got = population_generate(model, stacked, ids, mask, NEW, None, PAD)
    want = sequential_generate(model, stacked, ids, mask, NEW, None, PAD)
    assert got.tokens.shape == (N_MEMBERS, 4, NEW)
    assert_same(got, want)
    # The members really differ (the test would be vacuous if the noise did nothing).
    assert not torch.equal(got.tokens[0], got.tokens[1])
    # sequential_generate restored the model's own weights.
    fresh = tiny_model(tie)
    for (name, p), q in zip(model.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("tie", [True, False])
def test_own_weights_equal_model_generate(tie):
    model = tiny_model(tie)
    ids, mask = left_padded()
    got = population_generate(model, None, ids, mask, NEW, None, PAD)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                         eos_token_id=[], pad_token_id=PAD)
    assert got.tokens.shape == (1, 4, NEW)
    assert torch.equal(got.tokens[0], out[:, ids.shape[1]:])
    assert torch.equal(got.lengths, torch.full((1, 4), NEW))


def test_qwen2_with_qkv_biases():
    model = tiny_model(False, kind="qwen2")
    assert any(name.endswith("q_proj.bias") for name, _ in model.named_parameters())
    stacked = perturbed(model)
    ids, mask = left_padded()
    assert_same(population_generate(model, stacked, ids, mask, NEW, None, PAD),
                sequential_generate(model, stacked, ids, mask, NEW, None, PAD))


def test_eos_stops_rows_and_pads_after_it():
    model = tiny_model(False)
    stacked = perturbed(model)
    ids, mask = left_padded()
    free = population_generate(model, stacked, ids, mask, NEW, None, PAD)
    # An EOS the members do emit mid-sequence: the third token of member 0, prompt 0.
    eos = int(free.tokens[0, 0, 2])
    for eos_arg in (eos, [VOCAB - 1, eos]):
        got = population_generate(model, stacked, ids, mask, NEW, eos_arg, PAD)
        assert_same(got, sequential_generate(model, stacked, ids, mask, NEW, eos_arg, PAD))
        steps = torch.arange(NEW)
        for n in range(N_MEMBERS):
            for b in range(4):
                row, length = got.tokens[n, b], int(got.lengths[n, b])
                hits = (free.tokens[n, b] == eos).nonzero()
                want = int(hits[0]) + 1 if len(hits) else NEW
                assert length == want  # greedy and deterministic: stops at the first EOS it would emit
                assert torch.equal(row[:length], free.tokens[n, b, :length])
                assert (row[length:] == PAD).all()
        valid = steps[None, None] < got.lengths[..., None]
        assert (got.logprobs[~valid] == 0).all() and (got.entropies[~valid] == 0).all()
        assert (got.logprobs[valid] < 0).all() and (got.entropies[valid] > 0).all()
    assert got.lengths.min() < NEW  # some row did stop early


def test_all_rows_finishing_stops_early_and_keeps_shape():
    model = tiny_model(False)
    ids, mask = left_padded()
    free = population_generate(model, None, ids, mask, NEW, None, PAD)
    eos = sorted({int(free.tokens[0, b, 0]) for b in range(4)})  # every row's first token
    got = population_generate(model, None, ids, mask, NEW, eos, PAD)
    assert got.tokens.shape == (1, 4, NEW)
    assert torch.equal(got.lengths, torch.ones(1, 4, dtype=torch.long))
    assert (got.tokens[..., 1:] == PAD).all()


def test_sampling_is_reproducible_with_the_same_generator_seed():
    model = tiny_model(True)
    stacked = perturbed(model)
    ids, mask = left_padded()

    def sample(seed: int, top_p: float) -> pop.PopulationOutput:
        return population_generate(model, stacked, ids, mask, NEW, None, PAD, temperature=1.3, top_p=top_p,
                                   generator=torch.Generator().manual_seed(seed))

    for top_p in (1.0, 0.8):
        a, b, c = sample(7, top_p), sample(7, top_p), sample(8, top_p)
        assert_same(a, b, tol=0)
        assert not torch.equal(a.tokens, c.tokens)
        assert ((a.tokens >= 0) & (a.tokens < VOCAB)).all()
        assert torch.isfinite(a.logprobs).all() and torch.isfinite(a.entropies).all()
    greedy = population_generate(model, stacked, ids, mask, NEW, None, PAD)
    assert not torch.equal(sample(7, 1.0).tokens, greedy.tokens)


def test_categorical_draws_each_token_with_its_probability():
    """The inverse-CDF sampler: frequencies within 4 standard errors over 40,000 draws per row, never a
    zero-probability token, rows independent of each other, unnormalised rows allowed."""
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 2.0, 2.0]])
    g = torch.Generator().manual_seed(1)
    draws = torch.cat([pop.categorical(probs, g) for _ in range(40_000)], dim=1)  # [2, 40000]
    for row, p in enumerate(probs / probs.sum(-1, keepdim=True)):
        freq = torch.bincount(draws[row], minlength=4).double() / draws.shape[1]
        se = torch.sqrt(p.double() * (1 - p.double()) / draws.shape[1])
        assert ((freq - p.double()).abs() <= 4 * se + 1e-12).all(), (row, freq, p)
        assert freq[p == 0].sum() == 0


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    g = torch.Generator().manual_seed(0)
    drawn = {int(pop._sample(logits, 1.0, 0.75, g)) for _ in range(200)}
    assert drawn == {0, 1}  # 0.5 + 0.3 reaches 0.75: tokens 2 and 3 are outside the nucleus
    drawn = {int(pop._sample(logits, 1.0, 0.5, g)) for _ in range(50)}
    assert drawn == {0}


def test_sequential_sampling_is_reproducible():
    model = tiny_model(False)
    stacked = perturbed(model, n=2)
    ids, mask = left_padded()

    def sample(seed: int) -> pop.PopulationOutput:
        return sequential_generate(model, stacked, ids, mask, 6, None, PAD, temperature=1.0, top_p=0.9,
                                   generator=torch.Generator().manual_seed(seed))

    assert_same(sample(3), sample(3), tol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_logprobs_and_entropies_match_a_transformers_forward(tie):
    from torch.func import functional_call

    model = tiny_model(tie)
    stacked = perturbed(model)
    ids, mask = left_padded()
    out = population_generate(model, stacked, ids, mask, NEW, None, PAD, temperature=0.9,
                              generator=torch.Generator().manual_seed(0))
    member = 1
    full = torch.cat([ids, out.tokens[member]], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(out.tokens[member])], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    weights = {name: value[member] for name, value in stacked.items()}
    with torch.no_grad():
        logits = functional_call(model, weights, (), {"input_ids": full, "attention_mask": full_mask,
                                                      "position_ids": positions}).logits
    t = ids.shape[1]
    logp = torch.log_softmax(logits[:, t - 1:-1].float(), dim=-1)  # predicts the generated tokens
    want_lp = logp.gather(-1, out.tokens[member].unsqueeze(-1)).squeeze(-1)
    want_ent = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(out.logprobs[member], want_lp, atol=1e-4, rtol=0)
    torch.testing.assert_close(out.entropies[member], want_ent, atol=1e-4, rtol=0)


def test_stack_members_member_rows_and_prepared_weights():
    model = tiny_model(False)
    stacked = perturbed(model)
    sds = [{name: value[n] for name, value in stacked.items()} for n in range(N_MEMBERS)]
    sds[0]["lm_head.bias.unused"] = torch.zeros(1)  # extra keys are ignored
    restacked = stack_members(model, sds)
    assert set(restacked) == {name for name, _ in model.named_parameters()}
    for name in stacked:
        assert torch.equal(restacked[name], stacked[name])
    ids, mask = left_padded()
    full = population_generate(model, restacked, ids, mask, NEW, None, PAD)
    rows = torch.tensor([2, 0])
    subset = population_generate(model, stacked, ids, mask, NEW, None, PAD, member_rows=rows)
    assert_same(subset, pop.PopulationOutput(*(x[rows] for x in (full.tokens, full.lengths, full.logprobs,
                                                                  full.entropies))))
    assert_same(sequential_generate(model, stacked, ids, mask, NEW, None, PAD, member_rows=rows), subset)
    prepared = prepare_population(model, stacked)
    assert isinstance(prepared, PopulationWeights) and prepared.n_members == N_MEMBERS
    assert_same(population_generate(model, prepared, ids, mask, NEW, None, PAD), full, tol=0)
    with pytest.raises(KeyError):
        stack_members(model, [{}])


def test_missing_names_take_the_models_own_tensor():
    model = tiny_model(False)
    stacked = perturbed(model)
    partial = {name: value for name, value in stacked.items() if ".mlp." in name}
    completed = {name: partial.get(name, p.detach()[None].expand(N_MEMBERS, *p.shape))
                 for name, p in model.named_parameters()}
    ids, mask = left_padded()
    assert_same(population_generate(model, partial, ids, mask, NEW, None, PAD),
                population_generate(model, completed, ids, mask, NEW, None, PAD), tol=0)
    with pytest.raises(KeyError):
        population_generate(model, {"not.a.param": torch.zeros(2, 1)}, ids, mask, NEW, None, PAD)


def test_member_chunked_prefill_gives_the_same_result(monkeypatch):
    model = tiny_model(True)
    stacked = perturbed(model)
    ids, mask = left_padded()
    whole = population_generate(model, stacked, ids, mask, NEW, None, PAD)
    monkeypatch.setattr(pop, "_PREFILL_ACTIVATION_BYTES", 1)  # one member per prefill chunk
    monkeypatch.setattr(pop, "_PREFILL_SCORE_BYTES", 1)
    assert_same(population_generate(model, stacked, ids, mask, NEW, None, PAD), whole, tol=1e-5)


def test_fully_padded_prefix_gives_finite_outputs_and_one_token_works():
    model = tiny_model(False)
    ids, mask = left_padded(pads=(6, 0), length=7)  # one prompt of a single real token
    out = population_generate(model, perturbed(model), ids, mask, 1, None, PAD)
    assert out.tokens.shape == (N_MEMBERS, 2, 1)
    assert torch.isfinite(out.logprobs).all() and torch.isfinite(out.entropies).all()
    assert_same(out, sequential_generate(model, perturbed(model), ids, mask, 1, None, PAD))
    empty = population_generate(model, None, ids, mask, 0, None, PAD)
    assert empty.tokens.shape == (1, 2, 0)


def test_unsupported_models_are_refused():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2)).eval()
    with pytest.raises(NotImplementedError):
        population_generate(model, None, torch.ones(1, 2, dtype=torch.long), None, 2, None, 0)


# --------------------------------------------------------------------------- members from a Population


def population_of(model: torch.nn.Module, noise: Noise, n: int = 4, sigma: float = 0.05, dtypes=None) -> Population:
    theta = {name: p.detach().clone() for name, p in model.named_parameters()}
    return Population(theta, [(21, 1.0), (21, -1.0), (22, 1.0), (23, -1.0)][:n], sigma, noise, dtypes)


@pytest.mark.parametrize("kind, tie", [("llama", True), ("llama", False), ("qwen2", False)])
@pytest.mark.parametrize("rank", [1, 3])
def test_lowrank_members_equal_one_generate_call_per_dense_member(kind, tie, rank):
    """The shared-matrix forward (x W^T for all rows + (x B_n) A_n^T per member) is the dense member's maths."""
    model = tiny_model(tie, kind)
    members = population_of(model, Noise("lowrank", rank))
    ids, mask = left_padded()
    got = population_generate(model, members, ids, mask, NEW, None, PAD)
    assert_same(got, sequential_generate(model, members, ids, mask, NEW, None, PAD))
    assert not torch.equal(got.tokens[0], got.tokens[1])  # antithetic partners differ
    assert_same(got, population_generate(model, dict(members.items()), ids, mask, NEW, None, PAD))


def test_full_rank_population_is_the_stacked_members_bit_for_bit():
    model = tiny_model(True)
    members = population_of(model, Noise())
    ids, mask = left_padded()
    got = population_generate(model, members, ids, mask, NEW, None, PAD)
    assert_same(got, population_generate(model, dict(members.items()), ids, mask, NEW, None, PAD), tol=0)
    assert_same(got, sequential_generate(model, members, ids, mask, NEW, None, PAD))
    # a bf16 model's members are rounded to bf16 as stacking them would
    half = population_of(model, Noise(), dtypes={n: torch.bfloat16 for n, _ in model.named_parameters()})
    assert_same(population_generate(model, half, ids, mask, NEW, None, PAD),
                population_generate(model, dict(half.items()), ids, mask, NEW, None, PAD), tol=0)


@pytest.mark.parametrize("kernel", ["panel", "onednn"])
@pytest.mark.parametrize("noise", [Noise(), Noise("lowrank", 2)])
def test_packed_layouts_give_the_bmm_layouts_tokens(monkeypatch, noise, kernel):
    if kernel == "panel" and not panel_matmul.available():
        pytest.skip(f"no panel kernel here: {panel_matmul.unavailable_reason()}")
    if kernel == "onednn":
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
            pytest.skip("this torch build has no oneDNN packed linear")
        monkeypatch.setattr(panel_matmul, "available", lambda device="cpu": False)
    model = tiny_model(False, "qwen2")
    members = population_of(model, noise)
    ids, mask = left_padded()
    stacked = population_generate(model, members, ids, mask, NEW, None, PAD)
    monkeypatch.setattr(pw_module, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(pw_module, "SHARED_PACK_MIN_ELEMENTS", 1)
    prepared = prepare_population(model, members, rows=4)
    assert all(layer.gu.packed and layer.o.packed for layer in prepared.layers) and prepared.head.packed
    assert isinstance(prepared.head.weight[0], panel_matmul.Panels) == (kernel == "panel")
    assert prepared.layers[0].qkv.shared == (noise.kind == "lowrank")
    assert_same(population_generate(model, prepared, ids, mask, NEW, None, PAD), stacked)


def test_full_rank_members_run_in_memory_bounded_groups(monkeypatch):
    model = tiny_model(True)
    members = population_of(model, Noise())
    ids, mask = left_padded()
    whole = population_generate(model, members, ids, mask, NEW, None, PAD)
    per_member = pw_module.member_bytes(pw_module.arch_of(model))
    monkeypatch.setattr(groups, "GROUP_BYTES", 2 * per_member)
    split = pop.member_groups(model, members, None)
    assert [g.tolist() for g in split] == [[0, 1], [2, 3]]  # even sizes: antithetic partners together
    assert_same(population_generate(model, members, ids, mask, NEW, None, PAD), whole, tol=0)
    monkeypatch.setattr(groups, "GROUP_BYTES", 1)
    assert [g.tolist() for g in pop.member_groups(model, members, torch.tensor([3, 1, 0]))] == [[3, 1], [0]]
    assert pop.member_groups(model, population_of(model, Noise("lowrank", 2)), None) == [None]  # shares its weights


@pytest.mark.skipif(not panel_matmul.available(), reason="no panel kernel here (its test says why)")
def test_panel_pack_of_deferred_scales_equals_the_scaled_fold_bit_for_bit():
    model = tiny_model(False, "qwen2")
    arch = pw_module.arch_of(model)
    values = MemberValues(model, population_of(model, Noise()), None)
    perm_q = pw_module._rope_perm(arch.head_dim, arch.heads)
    perm_k = pw_module._rope_perm(arch.head_dim, arch.kv_heads)
    fold = pw_module._fused_fold(values, pw_module._qkv_parts(arch, 0, perm_q, perm_k),
                                 "model.layers.0.input_layernorm.weight")
    deferred = fold([1], True)
    assert deferred.row is not None and deferred.col is not None  # the q scale and the norm, still to apply
    packed = panel_matmul.pack(deferred.weight[0].clone(), deferred.col[0], deferred.row).data
    scaled = fold([1], False)
    assert torch.equal(packed, panel_matmul.pack(scaled.weight[0]).data)


@pytest.mark.parametrize("layout", ["bmm", "packed"])
@pytest.mark.parametrize("noise", [Noise(), Noise("lowrank", 2)])
def test_kept_buffers_give_fresh_buffers_results_bit_for_bit(monkeypatch, layout, noise):
    """An ES run's calls: fresh members every call, prompts of another length, on the buffers kept from the
    call before: the same tokens, log-probs and entropies as on memory of the call's own, and from the
    second call on nothing new is allocated."""
    if layout == "packed":
        monkeypatch.setattr(pw_module, "PACK_MIN_ELEMENTS", 1)
        monkeypatch.setattr(pw_module, "SHARED_PACK_MIN_ELEMENTS", 1)
    model = tiny_model(True, "qwen2")
    theta = {name: p.detach().clone() for name, p in model.named_parameters()}
    kept = pop.MemberBuffers()
    sizes, outs = [], []
    for call, (seed, length) in enumerate([(31, 7), (32, 5), (33, 9), (34, 7)]):
        members = Population(theta, [(seed, 1.0), (seed, -1.0), (seed + 100, 1.0), (seed + 100, -1.0)], 0.05, noise)
        ids, mask = left_padded(length=length, seed=call)
        fresh = population_generate(model, members, ids, mask, NEW, None, PAD)
        reused = population_generate(model, members, ids, mask, NEW, None, PAD, buffers=kept)
        assert_same(reused, fresh, tol=0)
        sizes.append(kept.nbytes())
        outs.append(reused.tokens)
    assert not any(torch.equal(a, b) for a, b in zip(outs[:-1], outs[1:], strict=True))  # fresh members: other tokens
    # the KV cache grows to the longest prompt (call 2) once; member blocks and scratch never
    assert sizes[0] > 0 and sizes[1] == sizes[0] and sizes[3] == sizes[2]


def test_weights_of_an_earlier_preparation_on_the_same_buffers_are_refused():
    model = tiny_model(False)
    kept = pop.MemberBuffers()
    first = prepare_population(model, population_of(model, Noise()), buffers=kept)
    ids, mask = left_padded()
    population_generate(model, first, ids, mask, 2, None, PAD)  # still valid
    prepare_population(model, population_of(model, Noise(), sigma=0.1), buffers=kept)
    with pytest.raises(RuntimeError, match="overwritten"):
        population_generate(model, first, ids, mask, 2, None, PAD)


def test_noise_drawn_into_kept_memory_is_the_same_noise():
    model = tiny_model(False)
    members = population_of(model, Noise())
    name = "model.layers.0.mlp.up_proj.weight"
    fresh = members._noise(21, name).clone()
    members.forget()
    kept = torch.full(tuple(fresh.shape), float("nan"))
    assert members._noise(21, name, lambda shape, slot: kept) is kept
    assert torch.equal(kept, fresh)


@pytest.mark.parametrize("packed", [False, True])
def test_the_plan_counts_what_the_engine_keeps(monkeypatch, packed):
    """`esgrpo.plan.memory.population_kept` against the bytes a real ES call's kept buffers hold."""
    from esgrpo.plan.architecture import from_config_dict
    from esgrpo.plan.memory import population_kept

    if packed:
        monkeypatch.setattr(pw_module, "PACK_MIN_ELEMENTS", 1)
    config = LlamaConfig(vocab_size=512, hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=True,
                         max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=PAD)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    theta = {name: p.detach().clone() for name, p in model.named_parameters()}
    kept = pop.MemberBuffers()
    ids, mask = left_padded(pads=(0, 2, 5, 1, 0, 3, 0, 1), length=12)
    population_generate(model, Population(theta, [(5, 1.0), (5, -1.0), (6, 1.0), (6, -1.0)], 0.05, Noise()), ids,
                        mask, NEW, None, PAD, buffers=kept)
    planned = sum(population_kept(from_config_dict(config.to_dict(), "t"), 4, 8, 12, NEW).values())
    assert 0.75 <= planned / kept.nbytes() <= 1.25, (planned, kept.nbytes())
