"""Config validation: schema defaults, and errors that name the key and the allowed values."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from esgrpo.config import ConfigError, check_config, software_env
from tests.conftest import REPO


@pytest.fixture
def default_config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_shipped_configs_pass(default_config):
    check_config(default_config)
    for path in (REPO / "configs").glob("*.yaml"):
        check_config(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["tasks"].update({"nonsense": {}}), "tasks.nonsense: unknown task"),
    (lambda c: c["models"]["tiny"]["tasks"].append("gsm8k"), "models.tiny.tasks"),
    (lambda c: c["eval"].update({"ks": [1, 64]}), "eval.ks"),
    (lambda c: c["es"]["settings"].update({"sigmaa": 0.1}), "sigmaa"),
    (lambda c: c["es"]["settings"].update({"normalization": "minmax"}), "normalization"),
    (lambda c: c["es"]["settings"].update({"noise": "lowrank", "rank": 0}), "rank"),
    (lambda c: (c["es"]["ablations"].update({"ranks": [4]}), c["es"].update({"backend": "vllm"})),
     "es.ablations.ranks: ESConfig.noise 'lowrank' is not supported on es.backend vllm"),
    (lambda c: c["es"]["ablations"].update({"task": "gsm8k"}), "es.ablations.task"),
    (lambda c: c["es"].update({"snapshots": [c["es"]["settings"]["iterations"]]}), "es.snapshots"),
    (lambda c: c["es"]["settings"].update({"snapshots": [2]}), r"es\.settings\.snapshots: set by es\.snapshots "),
    # A setting that another key sets for every run: refused with that key, never overridden in silence.
    (lambda c: c["es"]["settings"].update({"population_size": 8}),
     r"^es\.settings\.population_size: set by es\.population_sizes \(the main run is the first\), not here$"),
    (lambda c: c["es"]["settings"].update({"seed": 3}), r"^es\.settings\.seed: set by es\.seeds, not here$"),
    (lambda c: c["grpo"]["settings"].update({"num_generations": 4}), r"^grpo\.settings\.num_generations: set by grpo\.group_sizes"),
    (lambda c: c["grpo"]["settings"].update({"seed": 1}), r"^grpo\.settings\.seed: set by grpo\.seeds, not here$"),
    (lambda c: c["es"]["settings"].update({"antithetic": True}),
     r"^es\.settings\.antithetic: the main runs use False; ablation runs take theirs from es\.ablations\.antithetic$"),
    (lambda c: c["tasks"].update({"math": {"prompt": {"template": "{problem}"}}}),
     r"tasks\.math\.prompt\.template: unknown fields \['problem'\]; this task fills \['question'\]"),
    (lambda c: c["tasks"].update({"gsm8k": {"prompt": {"template": "Q: {}"}}}),
     r"tasks\.gsm8k\.prompt\.template: fields must be names"),
    (lambda c: c["tasks"].update({"gsm8k": {"prompt": {"template": "Q: {question"}}}),
     r"tasks\.gsm8k\.prompt\.template: expected '\}'"),
    (lambda c: c["tasks"].update({"boolq": {"prompt": {"user": "{question}"}}}),
     r"tasks\.boolq\.prompt: unknown keys \['user'\]"),
    (lambda c: c["tasks"]["countdown3"].update({"prompt": {"system": "Be brief."}}),
     r"tasks\.countdown3\.prompt: countdown3 keeps its own prompt"),
    (lambda c: c["tasks"].update({"countdown": {"selection": "first_per_level"}}),
     r"tasks\.countdown\.selection: 'first_per_level' is not known"),
    (lambda c: c["tasks"].update({"math": {"selection": "first"}}),
     r"tasks\.math\.selection: 'first' is not known; allowed: \['sample', 'first_per_level'\]"),
])
def test_bad_config_names_the_key(default_config, mutate, message):
    config = copy.deepcopy(default_config)
    mutate(config)
    with pytest.raises(ConfigError, match=message):
        check_config(config)


def test_the_main_runs_values_may_be_stated(default_config):
    """normalization zscore and antithetic false, what the paper configs write: the main runs' own values."""
    config = copy.deepcopy(default_config)
    config["es"]["settings"].update({"normalization": "zscore", "antithetic": False})
    check_config(config)


@pytest.mark.parametrize("block", ["es", "grpo"])
def test_an_unknown_setting_lists_only_the_keys_allowed_there(default_config, block):
    config = copy.deepcopy(default_config)
    config[block]["settings"]["sigmaa"] = 0.1
    with pytest.raises(ConfigError) as err:
        check_config(config)
    message = str(err.value)
    allowed = yaml.safe_load(message.split("; allowed: ")[1])
    assert message.startswith(f"{block}.settings: unknown setting(s) ['sigmaa']; allowed: ")
    assert "max_new_tokens" in allowed
    assert not {"reward_rules", "seed", "population_size", "num_generations", "snapshots"} & set(allowed), message


# --------------------------------------------------------------------------- settings per model (issue 30)


@pytest.mark.parametrize("override, message", [
    ({"eval": {"max_new_token": 48}}, r"models\.tiny\.eval\.max_new_token: unknown key; allowed here: \['backend', "),
    ({"eval": {"n_samples": "8"}}, r"models\.tiny\.eval\.n_samples: must be an integer, got '8'"),
    ({"es": {"setting": {"sigma": 0.1}}}, r"models\.tiny\.es\.setting: unknown key; allowed here: \['settings'\]"),
    ({"per_task": {"countdown3": {"eval": {"n_samples": 4}}}},
     r"models\.tiny\.per_task\.countdown3\.eval: unknown key; allowed here: \['es', 'grpo'\]"),
    ({"per_task": {"countdown3": {"grpo": {"settings": [1]}}}},
     r"models\.tiny\.per_task\.countdown3\.grpo\.settings: must be a mapping, got a list"),
])
def test_the_schema_refuses_a_bad_model_override_naming_model_and_key(default_config, override, message):
    config = copy.deepcopy(default_config)
    config["models"]["tiny"].update(override)
    assert re.match(message, schema_message(config)), schema_message(config)


def test_the_schema_takes_the_overrides_and_fills_no_default_into_them(default_config):
    """A model's eval block has eval's keys and ranges but none of its defaults: a default there would
    override the grid's eval block for that model."""
    from snakemake.utils import validate

    config = copy.deepcopy(default_config)
    config["models"]["tiny"].update(eval={"max_new_tokens": 48}, es={"settings": {"max_new_tokens": 48}},
                                    per_task={"countdown3": {"grpo": {"settings": {"steps": 3}}}})
    validate(config, str(REPO / "schemas" / "config.schema.yaml"))
    assert config["models"]["tiny"]["eval"] == {"max_new_tokens": 48}
    assert config["eval"]["n_samples"] == 32 and config["eval"]["max_new_tokens"] == 24  # the grid's, filled
    check_config(config)


@pytest.mark.parametrize("override, message", [
    ({"es": {"settings": {"sigmaa": 0.1}}}, r"^models\.tiny\.es\.settings: unknown setting\(s\) \['sigmaa'\]; allowed: "),
    ({"grpo": {"settings": {"seed": 1}}}, r"^models\.tiny\.grpo\.settings\.seed: set by grpo\.seeds, not here$"),
    ({"per_task": {"countdown3": {"es": {"settings": {"population_size": 4}}}}},
     r"^models\.tiny\.per_task\.countdown3\.es\.settings\.population_size: set by es\.population_sizes"),
    ({"es": {"settings": {"noise": "lowrank", "rank": 2}}},
     r"^models\.tiny\.es\.settings\.noise: one for the whole grid: es\.settings\.noise"),
    ({"es": {"settings": {"normalization": "rank"}}},
     r"^models\.tiny\.es\.settings\.normalization: the main runs use 'zscore'"),
    ({"per_task": {"gsm8k": {"es": {"settings": {"sigma": 0.1}}}}},
     r"^models\.tiny\.per_task\.gsm8k: tiny does not train on gsm8k; allowed: \['countdown3', "),
    # the merged settings are built like es.settings: es.snapshots [10] does not fit 5 iterations on countdown3
    ({"per_task": {"countdown3": {"es": {"settings": {"iterations": 5}}}}},
     r"^models\.tiny\.per_task\.countdown3\.es\.settings \(merged over es\.settings, on countdown3\): ESConfig\.snapshots"),
    ({"grpo": {"settings": {"max_new_tokens": 0}}},
     r"^models\.tiny\.grpo\.settings \(merged over grpo\.settings, on countdown3\): GRPOSettings\.max_new_tokens must be"),
    ({"eval": {"ks": [1, 64]}}, r"^models\.tiny\.eval\.ks: \[64\] exceed n_samples=32 \(merged over eval\)"),
])
def test_a_bad_model_override_names_the_model_and_key(default_config, override, message):
    config = copy.deepcopy(default_config)
    config["models"]["tiny"].update(override)
    with pytest.raises(ConfigError, match=message):
        check_config(config)


def test_an_override_of_a_block_the_config_lacks_is_refused(default_config):
    config = copy.deepcopy(default_config)
    del config["grpo"]
    config["models"]["tiny"]["grpo"] = {"settings": {"steps": 2}}
    with pytest.raises(ConfigError, match=r"^models\.tiny\.grpo\.settings: the config has no grpo block"):
        check_config(config)


def test_a_model_s_budget_may_not_split_the_continual_stage_one(default_config):
    """Tables read one grid-wide stage-1 alias (cl_es-s0-k1 = the main run or a run of its own): a model whose
    own iterations equal sequential.continual_budget while the others' do not is refused, naming both."""
    config = copy.deepcopy(default_config)
    its = config["es"]["settings"]["iterations"]
    config["sequential"]["continual_budget"] = {"es_iterations": its + 5}
    check_config(config)
    config["models"]["other"] = {"source": "default", "tasks": ["countdown3", "leg_count", "sum_yesno"],
                                 "es": {"settings": {"iterations": its + 5}}}
    with pytest.raises(ConfigError, match=r"^models\.<model>\.es\.settings: .* for \['other'\] and not for \['tiny'\]"):
        check_config(config)


def test_a_model_s_vllm_grpo_asks_for_the_gpu_env(default_config):
    config = copy.deepcopy(default_config)
    config["models"]["tiny"]["per_task"] = {"countdown3": {"grpo": {"settings": {"use_vllm": True}}}}
    assert software_env(config) == "gpu"


def test_schema_rejects_unknown_top_level_key_and_fills_defaults(default_config):
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    config = copy.deepcopy(default_config)
    config["eval"].pop("batch_size", None)
    validate(config, str(REPO / "schemas" / "config.schema.yaml"))
    assert config["eval"]["batch_size"] == 512
    config["unknown_block"] = 1
    with pytest.raises(WorkflowError, match="unknown_block"):
        validate(config, str(REPO / "schemas" / "config.schema.yaml"))


def test_the_analysis_defaults_are_stated_once(default_config):
    """The schema checks the analysis block's types; its defaults are esgrpo.analysis.settings.DEFAULTS
    (the Snakefile fills them in), so the two cannot drift apart."""
    import yaml

    from esgrpo.analysis.settings import DEFAULTS, analysis_config

    def defaults(node):
        if isinstance(node, dict):
            yield from ([node["default"]] if "default" in node else [])
            for value in node.values():
                yield from defaults(value)

    block = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())["properties"]["analysis"]
    assert all(value == {} for value in defaults(block))
    filled = analysis_config({"analysis": {"kl": {"seed": 3}}})
    assert filled["kl"] == {**DEFAULTS["kl"], "seed": 3} and filled["scan_multiples"] == DEFAULTS["scan_multiples"]


def test_schema_checks_the_task_prompt_and_selection(default_config):
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = str(REPO / "schemas" / "config.schema.yaml")
    for options, key in (({"selection": "first"}, "first"), ({"prompt": {"template": 3}}, "template"),
                         ({"prompt": {"sytem": "x"}}, "sytem")):
        config = copy.deepcopy(default_config)
        config["tasks"]["math"] = options
        with pytest.raises(WorkflowError, match=key):
            validate(config, schema)
    config = copy.deepcopy(default_config)
    config["tasks"]["math"] = {"selection": "first_per_level", "prompt": {"system": None, "template": "{question}"}}
    validate(config, schema)
    check_config(config)


def test_software_env_follows_the_backend(default_config):
    assert software_env(default_config) == "cpu"
    for name in ("paper_a", "paper_b"):
        assert software_env(yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())) == "gpu"
    config = copy.deepcopy(default_config)
    config["models"]["tiny"]["eval"] = {"device": "cuda:0"}
    assert software_env(config) == "gpu"


# --------------------------------------------------------------------------- errors a new user meets (issue 22)


def test_a_model_folder_that_does_not_exist_is_named(default_config, tmp_path):
    config = copy.deepcopy(default_config)
    config["models"]["tiny"]["source"] = "/nonexistent/model_dir"
    with pytest.raises(ConfigError, match=r"^models\.tiny\.source: the folder /nonexistent/model_dir does not "
                                          r"exist; give an existing folder in Hugging Face layout, a Hub id"):
        check_config(config)
    config["models"]["tiny"]["source"] = str(tmp_path)  # a folder, but no model in it
    with pytest.raises(ConfigError, match=r"models\.tiny\.source: the folder .* has no config\.json"):
        check_config(config)
    (tmp_path / "config.json").write_text("{}")
    check_config(config)


def test_an_exponent_without_a_dot_says_why_it_is_a_string(default_config):
    """PyYAML (YAML 1.1) reads 5e-4 as a string; the error says so and how to write it."""
    config = copy.deepcopy(default_config)
    config["grpo"]["settings"].update(yaml.safe_load("learning_rate: 5e-4"))
    assert config["grpo"]["settings"]["learning_rate"] == "5e-4"
    with pytest.raises(ConfigError, match=r"learning_rate .*got '5e-4': YAML 1\.1 \(Snakemake's config reader\) "
                                          r"reads 5e-4 as a string, not a number; write 5\.0e-4$"):
        check_config(config)
    config["grpo"]["settings"].update(yaml.safe_load("learning_rate: 5.0e-4"))
    check_config(config)
    config["es"]["settings"].update(yaml.safe_load("sigma: 1.0e3"))  # a dot, but the exponent has no sign
    with pytest.raises(ConfigError, match=r"sigma .*reads 1\.0e3 as a string, not a number; write 1\.0e\+3$"):
        check_config(config)


def schema_message(config: dict) -> str:
    from jsonschema import ValidationError
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from esgrpo.config import schema_error

    with pytest.raises(WorkflowError) as err:
        validate(config, str(REPO / "schemas" / "config.schema.yaml"))
    assert isinstance(err.value.__context__, ValidationError)
    return schema_error(err.value.__context__)


def test_a_schema_error_is_one_line_naming_the_key(default_config):
    config = copy.deepcopy(default_config)
    config["evl"] = {}
    message = schema_message(config)
    assert message.startswith("evl: unknown key; allowed here: ['analysis', 'default_model', 'es', 'eval',")
    assert "\n" not in message and len(message) < 300
    config = copy.deepcopy(default_config)
    config["eval"]["n_samples"] = "eight"
    assert schema_message(config) == "eval.n_samples: must be an integer, got 'eight' (schemas/config.schema.yaml)"
    config = copy.deepcopy(default_config)
    config["default_model"]["warmup"]["lr"] = "2e-3"
    assert schema_message(config).startswith("default_model.warmup.lr: must be a number, got '2e-3': YAML 1.1")
    config = copy.deepcopy(default_config)
    config["eval"]["test_size"] = [1]
    assert schema_message(config) == ("eval.test_size: must be an integer or null, got a list "
                                      "(schemas/config.schema.yaml)")


@pytest.mark.slow
@pytest.mark.parametrize("edit, line", [
    (lambda text: text + "\nevl: {}\n", "evl: unknown key; allowed here: ['analysis', "),
    (lambda text: text.replace("source: default", "source: /nonexistent/model_dir"),
     "models.tiny.source: the folder /nonexistent/model_dir does not exist"),
    (lambda text: text.replace("learning_rate: 0.0005", "learning_rate: 5e-4"),
     "reads 5e-4 as a string, not a number; write 5.0e-4"),
    (lambda text: text.replace("    tasks: [countdown3, sum_yesno]\n",
                               "    tasks: [countdown3, sum_yesno]\n    es: {settings: {max_new_token: 48}}\n"),
     "models.tiny.es.settings: unknown setting(s) ['max_new_token']; allowed: "),
    (lambda text: text + "\nanalysis: {analyses: [drift, drfit]}\n",
     "analysis.analyses: unknown ['drfit']; allowed: ['drift', 'theory'"),
])
def test_snakemake_stops_with_one_line(tmp_path, edit, line):
    """`snakemake -n` on a broken config: the line names the key and what to write; no schema dump, no
    `hf download` of a path (what issue 22 met)."""
    import os
    import subprocess
    import sys

    configfile = tmp_path / "broken.yaml"
    configfile.write_text(edit((REPO / "configs" / "ci.yaml").read_text()))
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--snakefile", str(REPO / "Snakefile"),
                          "--directory", str(tmp_path / "wd"), f"--configfile={configfile}"],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert sum(line in row for row in text.splitlines()) == 1, text
    assert len(text.splitlines()) < 12 and "Failed validating" not in text and "hf download" not in text, text
    assert not (tmp_path / "wd" / "results").exists()
