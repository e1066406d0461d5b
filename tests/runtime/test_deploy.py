"""deploy/ stays in step with the CLI and the package: the KubeRay manifest parses, names the Ray
release the package pins, gives the GPU workers their GPUs, MPS and model cache, and every
`swapstream` command in it (and in the Dockerfile) is parsed by the real CLI, so an option renamed or
removed fails here rather than in a cluster."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from swapstream.cli import app

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "kuberay" / "raycluster.yaml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def parse_cli(argv: list[str]) -> Any:
    """Parse `swapstream ARGV` with the CLI's own parser (nothing runs) and return the command's
    context; a UsageError (typer's click) for an unknown command or option, or a value of the wrong
    kind."""
    group: Any = typer.main.get_command(app)  # typer ships its own click: duck-typed here
    with group.make_context("swapstream", list(argv), resilient_parsing=False) as ctx:
        name, cmd, rest = group.resolve_command(ctx, list(argv))
        assert cmd is not None, argv
        return cmd.make_context(name or "", rest, parent=ctx)


def swapstream_commands(text: str) -> list[list[str]]:
    """Every `swapstream ...` command in a shell line (up to the next ';', '&' or end)."""
    out = []
    for part in re.split(r"[;&]", text):
        words = shlex.split(part)
        if "swapstream" in words:
            out.append(words[words.index("swapstream") + 1:])
    return out


def docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def test_the_raycluster_names_our_ray_and_gives_workers_gpus_mps_and_models() -> None:
    pinned = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cluster"]
    ray = next(d for d in docs() if d["kind"] == "RayCluster")
    assert ray["apiVersion"] == "ray.io/v1"
    assert pinned == [f"ray=={ray['spec']['rayVersion']}"]
    (group,) = ray["spec"]["workerGroupSpecs"]
    worker = group["template"]["spec"]["containers"][0]
    gpus = worker["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus >= 1 and group["rayStartParams"]["num-gpus"] == str(gpus)
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert "nvidia-cuda-mps-control -d" in worker["args"][0] and env["CUDA_MPS_PIPE_DIRECTORY"]
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert mounts["models"] == env["SWAPSTREAM_MODELS_DIR"] == "/models"
    claims = {d["metadata"]["name"] for d in docs() if d["kind"] == "PersistentVolumeClaim"}
    volumes = group["template"]["spec"]["volumes"]
    assert {v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v} <= claims
    # The API's Service reaches the head, where the server listens.
    head = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    service = next(d for d in docs() if d["kind"] == "Service")
    assert service["spec"]["selector"] == {"ray.io/cluster": ray["metadata"]["name"], "ray.io/node-type": "head"}
    assert service["spec"]["ports"][0]["targetPort"] in [p["containerPort"] for p in head["ports"]]


def test_every_swapstream_command_in_deploy_is_one_the_cli_accepts() -> None:
    ray = next(d for d in docs() if d["kind"] == "RayCluster")
    head = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    (serve,) = swapstream_commands(head["args"][0])
    ctx = parse_cli(serve)
    assert ctx.command.name == "serve"
    assert ctx.params["ray"] == "auto" and ctx.params["workers"] >= 1 and 0 < ctx.params["ray_gpus"] <= 1
    assert ctx.params["port"] == head["readinessProbe"]["httpGet"]["port"]
    init = ray["spec"]["workerGroupSpecs"][0]["template"]["spec"]["initContainers"][0]
    assert init["command"][0] == "swapstream"
    assert parse_cli(init["command"][1:]).command.name == "setup"
    # A renamed option would be refused: the check is not vacuous.
    with pytest.raises(Exception) as refused:
        parse_cli(serve + ["--ray-gpu-share", "0.5"])
    assert type(refused.value).__name__ == "NoSuchOption"


def test_the_dockerfile_installs_the_gpu_and_cluster_extras_on_a_cuda_runtime_base() -> None:
    text = DOCKERFILE.read_text()
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
    known = {"FROM", "RUN", "ENV", "WORKDIR", "COPY", "USER", "EXPOSE", "CMD", "ARG", "LABEL"}
    # Continuation lines aside, every line starts with an instruction Docker knows.
    instructions = [x.split()[0] for i, x in enumerate(lines) if i == 0 or not lines[i - 1].endswith("\\")]
    assert set(instructions) <= known, set(instructions) - known
    assert re.fullmatch(r"FROM nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+", lines[0])
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (install,) = [x for x in lines if "pip install" in x]
    asked = re.search(r'"\.\[([a-z,]+)\]"', install)
    assert asked is not None and {"gpu", "cluster"} <= set(asked.group(1).split(",")) <= set(extras)
    # CUDA 13's CuPy: the base's CUDA major is the one the gpu extra is built for.
    major = re.search(r"nvidia/cuda:(\d+)\.", lines[0]).group(1)  # type: ignore[union-attr]
    assert any(f"cuda{major}x" in x for x in extras["gpu"]), extras["gpu"]
    for line in lines:
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), f"the Dockerfile copies {src}, which is not in the repository"
    cmd = re.search(r'^CMD (\[.*\])$', text, re.M)
    assert cmd is not None and yaml.safe_load(cmd.group(1))[0] == "swapstream"
