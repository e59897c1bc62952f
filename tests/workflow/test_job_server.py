"""The local job server (esgrpo.workflow.job_server): a stage forked from the warm interpreter writes exactly what
it writes in a process of its own, a failing stage fails its job, and a job of another interpreter or
host never reaches the server."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from esgrpo.files import read_json, write_json, write_jsonl
from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
from esgrpo.models.loading import save_model
from esgrpo.tasks.offline import load_sum_yesno
from esgrpo.workflow import job_server
from esgrpo.workflow.bridge import StageCall

EVALUATE = "esgrpo.workflow.stages.evaluation:evaluate_checkpoint"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model and a few test rows on disk, as the workflow's eval_run job sees them."""
    folder = tmp_path_factory.mktemp("job_server")
    rows = load_sum_yesno("train", 40, 0)
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] for r in rows], 300)
    model = build_tiny_llama(tokenizer, TinyLlamaSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=2, num_key_value_heads=1), seed=0)
    save_model(model, tokenizer, folder / "model")
    write_jsonl(folder / "test.jsonl", load_sum_yesno("test", 12, 0))
    write_json(folder / "info.json", {"task": "sum_yesno", "verifier": "yesno"})
    return folder


def evaluate_call(folder, name: str, model: str | None = None) -> StageCall:
    out = folder / name
    out.mkdir(exist_ok=True)
    params = {"model": model or str(folder / "model"), "eval_tasks": ["sum_yesno"], "run": "r", "train_task": "t",
              "eval": {"n_samples": 4, "temperature": 1.0, "max_new_tokens": 8, "ks": [1, 2, 4], "test_size": 12}}
    kwargs = {"input": {"test": [str(folder / "test.jsonl")], "info": [str(folder / "info.json")]},
              "output": {"summary": str(out / "eval.json"), "prompts": str(out / "eval_prompts.jsonl")},
              "params": params, "wildcards": {"model": "tiny"}, "threads": 1}
    return StageCall(EVALUATE, kwargs, str(out / "eval.log"), 0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    started = job_server.start(tmp_path_factory.mktemp("server") / "server.log")
    yield started
    started.stop()


def test_a_stage_forked_by_the_server_writes_what_it_writes_in_process(checkpoint, server):
    evaluate_call(checkpoint, "here").run()
    code = job_server.submit(evaluate_call(checkpoint, "forked"), job_server.server_address())
    assert code == 0, (checkpoint / "forked" / "eval.log").read_text()
    here, forked = checkpoint / "here", checkpoint / "forked"
    assert (here / "eval_prompts.jsonl").read_bytes() == (forked / "eval_prompts.jsonl").read_bytes()

    def measured(path):  # what the stage computed: everything but provenance and wall-clock seconds
        return [{k: v for k, v in e.items() if k != "seconds"} for e in read_json(path)["evaluations"]]

    assert measured(here / "eval.json") == measured(forked / "eval.json")
    assert "job server child: cpu" in (forked / "eval.log").read_text()  # the job's own CPU, not the client's
    assert measured(here / "eval.json")[0]["pass@1"] >= 0


def test_a_failing_stage_fails_its_job_and_the_server_keeps_serving(checkpoint, server):
    broken = evaluate_call(checkpoint, "broken", model=str(checkpoint / "no-such-model"))
    assert job_server.submit(broken, job_server.server_address()) == 1
    assert "Traceback" in (checkpoint / "broken" / "eval.log").read_text()
    assert job_server.submit(evaluate_call(checkpoint, "after"), job_server.server_address()) == 0
    assert (checkpoint / "after" / "eval.json").exists()


def test_jobs_of_another_interpreter_or_host_run_in_their_own_process(server, monkeypatch):
    here = json.loads(os.environ[job_server.SERVER_ENV])
    assert here["host"] == socket.gethostname() and here["python"] == os.path.realpath(sys.executable)
    assert job_server.server_address() == here["socket"]
    for key, other in (("python", "/opt/conda/envs/x/bin/python"), ("host", "another-node")):
        monkeypatch.setenv(job_server.SERVER_ENV, json.dumps({**here, key: other}))
        assert job_server.server_address() is None
    monkeypatch.setenv(job_server.SERVER_ENV, json.dumps(here))
    monkeypatch.setenv(job_server.DISABLE_ENV, "1")
    assert job_server.server_address() is None
