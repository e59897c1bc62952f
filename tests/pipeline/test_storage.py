"""The workflow without a shared filesystem, as on Kubernetes or a cloud batch service: every file through a
default storage provider (a real S3 server on localhost, moto's, through snakemake-storage-plugin-s3) and
`--shared-fs-usage none`. The CI grid runs to completion with the tables of a local run, and a training job
killed mid-run resumes, in a working directory without its progress folder, from the checkpoint kept in storage
(esgrpo.workflow.progress_store; docs/cluster.md, "Kubernetes and cloud batch")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.storage

BIN = Path(sys.executable).parent
BUCKET = "esgrpo-ci"
CI = REPO / "configs" / "ci.yaml"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port of localhost, one bucket, the plugin's settings as environment variables
    (how a Kubernetes secret hands them to the jobs)."""
    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    deadline = time.time() + 60
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            break
        except Exception:
            if time.time() > deadline or server.poll() is not None:
                raise
            time.sleep(0.5)
    env = {"SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": url, "SNAKEMAKE_STORAGE_S3_ACCESS_KEY": "testing",
           "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "testing"}
    yield client, env
    server.terminate()
    server.wait(timeout=30)
    log.close()


def on_s3(workdir: Path, prefix: str, env: dict, configfile: Path, *args: str) -> list[str]:
    """The snakemake command of a run whose every file goes through S3 under s3://esgrpo-ci/<prefix>."""
    return [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir), f"--configfile={configfile}",
            "--default-storage-provider", "s3", "--default-storage-prefix", f"s3://{BUCKET}/{prefix}",
            "--shared-fs-usage", "none", "--cores", "2", *args]  # --cores ends --shared-fs-usage's list


def run(cmd: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def stored(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def test_ci_grid_on_s3_has_the_tables_of_a_local_run(ci_workflow, s3, tmp_path):
    client, env = s3
    run(on_s3(tmp_path / "work", "grid", env, CI), env, timeout=2400)
    tables = sorted((ci_workflow / "tables").glob("*.csv"))
    assert {Path(k).name for k in keys(client, "grid/results/ci/tables/") if k.endswith(".csv")} == {
        t.name for t in tables} and len(tables) >= 16
    for table in tables:
        assert stored(client, f"grid/results/ci/tables/{table.name}") == table.read_bytes(), table.name
    figures = keys(client, "grid/results/ci/figures/")
    assert {Path(k).name for k in figures} == {p.name for p in (ci_workflow / "figures").iterdir()}
    # the working directory kept no result: every output went to storage
    assert not list((tmp_path / "work").glob("results/ci/tables/*"))


# Loaded by every Python process of the killed run (PYTHONPATH): the training job stores its progress folder and
# sends SIGKILL to its process group (driver, job server, itself) as it is about to write checkpoint KILL_AT: the kill
# point is fixed whatever the machine's speed.
KILL_HOOK = """
import os
if os.environ.get("ESGRPO_TEST_KILL_AT"):
    import signal
    from esgrpo.progress import ProgressFolder
    from esgrpo.workflow.progress_store import ProgressStore

    kill_at, stores = int(os.environ["ESGRPO_TEST_KILL_AT"]), []
    enter, write = ProgressStore.__enter__, ProgressFolder.write_checkpoint

    def enter_and_keep(self):
        stores.append(self)
        return enter(self)

    def write_or_die(self, step, *args):
        if step == kill_at:
            store = stores[-1]
            store._stop.set()  # its thread ends; then what the folder holds goes to storage, in this thread
            store._thread.join()
            store.store()
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return write(self, step, *args)

    ProgressStore.__enter__, ProgressFolder.write_checkpoint = enter_and_keep, write_or_die
"""


def test_killed_training_resumes_from_the_checkpoint_in_storage(s3, tmp_path):
    """One ES run killed between checkpoints (SIGKILL to the whole run after checkpoint 20 is in storage, as it is
    about to write 30), the local progress folder deleted (another node), then the same command resumes from
    storage and ends with all 150 iterations' metrics."""
    client, env = s3
    config = yaml.safe_load(CI.read_text())
    config["es"]["settings"].update(iterations=150, checkpoint_every=10)
    configfile = tmp_path / "long_es.yaml"
    configfile.write_text(yaml.safe_dump(config))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    # the grid's storage (its base model and data, when the grid test ran first), another working directory
    work, prefix = tmp_path / "work", "grid"
    run_dir = "tiny/countdown3/es-n4-s0"
    target = f"results/ci/{run_dir}/summary.json"
    progress = f"{prefix}/results/ci/progress/{run_dir}/"
    run(on_s3(work, prefix, env, configfile, f"results/ci/{run_dir.split('/')[0]}/base/model"), env, timeout=1200)
    for key in keys(client, progress):  # the grid's own run of it (3 iterations)
        client.delete_object(Bucket=BUCKET, Key=key)

    cmd = on_s3(work, prefix, env, configfile, "--forcerun=train_run", target)
    killed_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
                  "ESGRPO_TEST_KILL_AT": "30"}
    with open(tmp_path / "killed.log", "w") as log:
        driver = subprocess.Popen(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1", **env, **killed_env}, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        driver.wait(timeout=900)
    assert driver.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    assert f"{prefix}/{target}" not in keys(client, f"{prefix}/results/ci/{run_dir}/")  # it died before the end
    assert sorted(k for k in keys(client, progress) if k.endswith(".stored")) == [f"{progress}step-00000020.stored"]
    shutil.rmtree(work / "results" / "ci" / "progress")  # a fresh node: nothing of the run on its disk

    run(on_s3(work, prefix, env, configfile, "--unlock"), env, timeout=600)
    run(cmd, env, timeout=1200)
    summary = json.loads(stored(client, f"{prefix}/{target}"))
    assert summary["resumed_from"] == 20
    rows = [json.loads(line) for line in stored(client, f"{prefix}/results/ci/{run_dir}/metrics.jsonl").splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, 151))
    log = stored(client, f"{prefix}/results/ci/logs/{run_dir}/train.log").decode()
    assert "es: resuming after iteration 20 of 150" in log


def test_progress_store_fetches_only_whole_checkpoints(s3, tmp_path, monkeypatch):
    """A checkpoint is fetched once its marker is stored (after its files); a removed one leaves storage."""
    from esgrpo.workflow.progress_store import ProgressStore

    client, env = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    folder = Path("progress/run")
    (folder / "step-00000002").mkdir(parents=True)
    (folder / "run.json").write_text('{"fingerprint": "f"}')
    (folder / "step-00000002" / "state.json").write_text("{}")
    (folder / "writer.lock").write_text("this host")
    store = ProgressStore(folder, "s3", f"s3://{BUCKET}/unit")
    store.store()
    # the trainer's next checkpoint replaces the older one; a third is cut off while storing (no marker)
    (folder / "step-00000004").mkdir()
    (folder / "step-00000004" / "state.json").write_text('{"iteration": 4}')
    shutil.rmtree(folder / "step-00000002")
    (folder / "checkpoint-5").mkdir()  # TRL's, being written: no trainer_state.json yet, so no marker
    (folder / "checkpoint-5" / "model.safetensors").write_text("w")
    store.store()
    client.put_object(Bucket=BUCKET, Key="unit/progress/run/step-00000006/state.json", Body=b"{}")
    assert sorted(keys(client, "unit/")) == ["unit/progress/run/checkpoint-5/model.safetensors",
                                             "unit/progress/run/run.json", "unit/progress/run/step-00000004.stored",
                                             "unit/progress/run/step-00000004/state.json",
                                             "unit/progress/run/step-00000006/state.json"]
    shutil.rmtree("progress")
    assert ProgressStore(folder, "s3", f"s3://{BUCKET}/unit").fetch() == ["run.json", "step-00000004"]
    assert (folder / "step-00000004" / "state.json").read_text() == '{"iteration": 4}'
    assert not (folder / "step-00000006").exists() and not (folder / "checkpoint-5").exists()
    assert not (folder / "writer.lock").exists()
