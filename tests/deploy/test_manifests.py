"""The deploy files say only what the program understands.

- Every Kubernetes document validates against the bundled Kubernetes JSON schemas of
  `kubernetes-validate` (offline, strict: an unknown or misspelt field fails), at the oldest and
  newest supported versions of the range we claim.
- Every bradley command line in compose.yaml and the manifests (a container of the bradley image:
  its ENTRYPOINT is `bradley`; under `torchrun -m service.cli`, the arguments after the module) is
  accepted by the real argument parser, and `bradley <command> --help` lists each flag it uses.
  torchrun's own flags go through torchrun's parser.
- Every port agrees: the one `bradley serve` listens on (--port, else BRADLEY_PORT from the
  container or the Dockerfile) is the container port, the port the probes, Services, scrape
  annotations, compose and prometheus.yml use; probe and scrape paths are routes of the app.
- Every BRADLEY_* variable set anywhere is a setting (pydantic-settings ignores unknown ones, so a
  typo would otherwise be silent).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, ROOT

K8S_VERSIONS = ("1.28", "1.35")   # the clusters we claim: oldest and a recent one
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
IMAGE = "bradley"


def documents() -> list[tuple[str, dict]]:
    return [(f"{p.name}#{i}", doc) for p in MANIFESTS
            for i, doc in enumerate(yaml.safe_load_all(p.read_text())) if doc]


def pod_specs() -> list[tuple[str, dict, dict]]:
    """(where, pod template metadata, pod spec) of every workload."""
    found = []
    for where, doc in documents():
        spec = doc.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if template:
            found.append((f"{where} {doc['kind']}/{doc['metadata']['name']}",
                          template.get("metadata", {}), template["spec"]))
    return found


def bradley_containers() -> list[tuple[str, dict, dict]]:
    """(where, container, pod metadata) for containers of the bradley image."""
    return [(f"{where} {c['name']}", c, meta) for where, meta, spec in pod_specs()
            for c in spec.get("initContainers", []) + spec["containers"]
            if c["image"].split(":")[0].rsplit("/", 1)[-1] == IMAGE]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for line in re.findall(r"^ENV\s+(.+?)(?<!\\)$", DOCKERFILE.read_text().replace("\\\n", " "), re.M):
        env.update(dict(pair.split("=", 1) for pair in shlex.split(line) if "=" in pair))
    return env


def bradley_argv(container: dict) -> list[str]:
    """The bradley arguments a container runs (ENTRYPOINT bradley, or torchrun -m service.cli)."""
    command, args = container.get("command"), [str(a) for a in container.get("args", [])]
    if not command:
        return args
    assert command == ["torchrun"], f"{command}: run the image's bradley entry point or torchrun"
    from torch.distributed.run import get_args_parser

    parsed = _parse(get_args_parser(), args, "torchrun")
    assert parsed.module and parsed.training_script == "service.cli", \
        "torchrun must launch `-m service.cli` (the bradley CLI)"
    return list(parsed.training_script_args)


def compose_services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def compose_bradley() -> dict[str, dict]:
    return {name: s for name, s in compose_services().items()
            if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
            or str(s.get("image", "")).split(":")[0] == IMAGE}


def _parse(parser, argv: list[str], what: str):
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{what} does not accept: {shlex.join(argv)}")


def _all_argvs() -> list[tuple[str, list[str], dict]]:
    """(where, bradley argv, environment) for compose and Kubernetes."""
    found = [(f"compose {name}", [str(a) for a in s.get("command", ["serve"])],
              {k: str(v) for k, v in (s.get("environment") or {}).items()})
             for name, s in compose_bradley().items()]
    for where, container, _ in bradley_containers():
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env", [])}
        found.append((where, bradley_argv(container), env))
    return found


def serve_port(argv: list[str], env: dict) -> int:
    from service.api.settings import Settings
    from service.cli.main import build_parser

    args = build_parser().parse_args(argv)
    return int(args.port or env.get("BRADLEY_PORT") or dockerfile_env().get("BRADLEY_PORT")
               or Settings.model_fields["port"].default)


def app_routes() -> set[str]:
    from service.api.app import create_app
    from service.api.settings import load_settings

    def paths(routes):  # FastAPI may keep included routers as wrappers of the original router
        for route in routes:
            if hasattr(route, "path"):
                yield route.path
            inner = getattr(route, "routes", None) or getattr(
                getattr(route, "original_router", None), "routes", None)
            yield from paths(inner or [])

    app = create_app(load_settings(db="unused.duckdb", read_only=True))
    return set(paths(app.routes)) | set(app.openapi()["paths"])


# --- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version):
    import kubernetes_validate

    kinds = set()
    for where, doc in documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{where} ({doc.get('kind')}): {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{where}: {exc.message}")
        kinds.add(doc["kind"])
    assert kinds >= {"Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget", "Job"}


def test_the_validator_rejects_a_misspelt_field():
    """The schema check is not vacuous: `replica` (for `replicas`) in a StatefulSet spec fails."""
    import kubernetes_validate

    doc = next(d for _, d in documents() if d["kind"] == "StatefulSet")
    broken = {**doc, "spec": {**doc["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_scaling_objects_point_at_the_scorer():
    docs = {doc["kind"]: doc for _, doc in documents() if doc["kind"] != "Service"}
    scorer = next(d for _, d in documents() if d["kind"] == "Deployment")
    hpa, pdb = docs["HorizontalPodAutoscaler"], docs["PodDisruptionBudget"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == scorer["metadata"]["name"]
    assert "replicas" not in scorer["spec"], "the HPA owns the replica count"
    assert pdb["spec"]["selector"]["matchLabels"] == scorer["spec"]["selector"]["matchLabels"]
    requests = scorer["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert "cpu" in requests, "CPU utilization targets need a CPU request"


def test_scorers_are_stateless():
    scorer = next(d for _, d in documents() if d["kind"] == "Deployment")
    pod = scorer["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--read-only" in container["args"]
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims and all(v["persistentVolumeClaim"].get("readOnly") for v in claims)
    assert all(m.get("readOnly") for m in container["volumeMounts"]
               if m["name"] in {v["name"] for v in claims})


# --- commands, flags, ports, settings -----------------------------------------------------------


def test_every_command_line_parses():
    from service.cli.main import build_parser

    argvs = _all_argvs()
    assert {argv[argv.index(c)] for _, argv, _ in argvs for c in ("serve", "train", "ingest")
            if c in argv} == {"serve", "train", "ingest"}
    for where, argv, _ in argvs:
        _parse(build_parser(), argv, f"{where}: bradley")


def test_every_flag_is_in_the_commands_help():
    """`bradley <command> [<kind>] --help`, run as the installed program, lists every flag used."""
    from service.cli.main import COMMANDS

    flags_by_command: dict[tuple[str, ...], set[str]] = {}
    for _, argv, _ in _all_argvs():
        words = [a for a in argv if not a.startswith("-")]
        command = next(w for w in words if w in COMMANDS)
        path = (command, *[w for w in words[words.index(command) + 1:][:1] if command == "train"])
        flags = {a.split("=")[0] for a in argv if a.startswith("--")} - {"--db"}
        flags_by_command.setdefault(path, set()).update(flags)
    program = Path(sys.executable).with_name("bradley")
    base = [str(program)] if program.exists() else [sys.executable, "-m", "service.cli"]
    top = subprocess.run([*base, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert top.returncode == 0 and "--db" in top.stdout
    for path, flags in flags_by_command.items():
        done = subprocess.run([*base, *path, "--help"], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
        assert done.returncode == 0, done.stderr
        missing = {f for f in flags if not re.search(rf"{re.escape(f)}\b", done.stdout)}
        assert not missing, f"bradley {' '.join(path)} --help lacks {sorted(missing)}"


def test_every_bradley_variable_is_a_setting():
    from service.api.settings import Settings

    names = set(dockerfile_env())
    for service in compose_bradley().values():
        names |= set(service.get("environment") or {})
    for _, container, _ in bradley_containers():
        names |= {e["name"] for e in container.get("env", [])}
    bradley = {n for n in names if n.startswith("BRADLEY_")}
    assert len(bradley) >= 5
    unknown = {n for n in bradley if n[len("BRADLEY_"):].lower() not in Settings.model_fields}
    assert not unknown, f"not settings (service/api/settings.py): {sorted(unknown)}"


def test_kubernetes_ports_and_paths_agree_with_the_server():
    routes = app_routes()
    served = [(w, c, m) for w, c, m in bradley_containers() if "serve" in bradley_argv(c)]
    assert len(served) >= 2
    services = [d for _, d in documents() if d["kind"] == "Service"]
    for where, container, meta in served:
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env", [])}
        port = serve_port(bradley_argv(container), env)
        named = {p.get("name"): p["containerPort"] for p in container["ports"]}
        assert port in named.values(), f"{where}: serves on {port}, declares {named}"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in container:
                get = container[probe]["httpGet"]
                assert named.get(get["port"], get["port"]) == port, f"{where}: {probe} port"
                assert get["path"] in routes, f"{where}: {probe} path {get['path']} is no route"
        notes = meta.get("annotations", {})
        if notes.get("prometheus.io/scrape") == "true":
            assert int(notes["prometheus.io/port"]) == port, f"{where}: scrape port"
            assert notes.get("prometheus.io/path", "/metrics") in routes
        labels = meta.get("labels", {})
        for svc in services:
            if svc["spec"].get("selector", {}).items() <= labels.items():
                for p in svc["spec"]["ports"]:
                    target = p.get("targetPort", p["port"])
                    assert named.get(target, target) == port, f"{svc['metadata']['name']} -> {where}"


def test_the_training_rendezvous_port_is_the_services():
    job = next(d for _, d in documents() if d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    from torch.distributed.run import get_args_parser

    torchrun = get_args_parser().parse_args([str(a) for a in container["args"]])
    host, port = torchrun.rdzv_endpoint.rsplit(":", 1)
    pod0, service = host.split(".")[:2]
    assert pod0 == f"{job['metadata']['name']}-0", "pod 0 of an Indexed Job is <job>-0"
    assert job["spec"]["template"]["spec"]["subdomain"] == service
    headless = next(d for _, d in documents() if d["kind"] == "Service" and d["metadata"]["name"] == service)
    assert headless["spec"]["clusterIP"] == "None"
    assert int(port) in [p["port"] for p in headless["spec"]["ports"]]
    assert int(port) in [p["containerPort"] for p in container["ports"]]
    nodes = job["spec"]["completions"]
    assert job["spec"]["parallelism"] == nodes and torchrun.nnodes == str(nodes)


def test_compose_dockerfile_and_prometheus_ports_agree():
    routes, env = app_routes(), dockerfile_env()
    port = int(env["BRADLEY_PORT"])
    assert re.search(rf"^EXPOSE {port}$", DOCKERFILE.read_text(), re.M)
    health = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", DOCKERFILE.read_text())
    assert int(health.group(1)) == port and health.group(2) in routes
    targets = {}
    for name, service in compose_bradley().items():
        argv = [str(a) for a in service.get("command", ["serve"])]
        served = serve_port(argv, {k: str(v) for k, v in (service.get("environment") or {}).items()})
        for mapping in service["ports"]:
            host, _, inside = str(mapping).rpartition(":")
            assert host.startswith("127.0.0.1:"), f"compose {name}: publish on 127.0.0.1 only"
            assert int(inside) == served, f"compose {name}: {mapping} but serves on {served}"
        targets[f"{name}:{served}"] = name
    for service in compose_services().values():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), mapping
    config = yaml.safe_load(PROMETHEUS.read_text())
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") in routes
        for static in job["static_configs"]:
            assert set(static["targets"]) <= set(targets), f"{static['targets']} vs {targets}"
