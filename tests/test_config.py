"""Config validation: schema defaults, and errors that name the key and the allowed values."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO

from esgrpo.config import ConfigError, check_config, software_env


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
    (lambda c: c["es"]["settings"].update({"snapshots": [2]}), "es.settings.snapshots: list the iterations"),
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
