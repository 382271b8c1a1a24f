"""deploy/kubernetes/ validates offline, and a broken copy of each resource does not.

- agent-sandbox kinds (SandboxTemplate, SandboxWarmPool, SandboxClaim) against the
  openAPIV3Schema of the CRDs vendored from a pinned agent-sandbox release
  (deploy/kubernetes/vendor/agent-sandbox), with unknown fields rejected: every object
  schema that lists its properties and does not preserve unknown fields is closed, as
  the API server prunes (and, with `kubectl apply --validate=strict`, refuses) them;
- core kinds with kubernetes-validate in strict mode (its schemas are bundled: no network);
- what ties the files together: names the others refer to, probes on the server's own
  endpoints and port, the grace period above the drain, the router in scoped-token mode,
  the network policy selecting the cells and the router, the CI Job running `run --policy ci`.

No cluster and no network (kubernetes-validate's schemas are bundled); the server binary
only to parse the template's environment. A few seconds in all.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
VENDOR = K8S / "vendor" / "agent-sandbox"
CONTAINERFILE = REPO / "deploy" / "Containerfile"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
KUBERNETES_VERSION = "1.33"  # the oldest release with user namespaces on by default (hostUsers)


def documents() -> list[tuple[str, int, dict[str, Any]]]:
    """(file name, index in the file, document) for every manifest of deploy/kubernetes/."""
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for i, doc in enumerate(yaml.load_all(path.read_text(), Loader=LOADER)):
            if doc is not None:
                out.append((path.name, i, doc))
    return out


DOCS = documents()


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, _, d in DOCS if d.get("kind") == kind]


def one(kind: str) -> dict[str, Any]:
    found = by_kind(kind)
    assert len(found) == 1, f"expected one {kind} in deploy/kubernetes/, found {len(found)}"
    return found[0]


# --- the vendored CRDs ---------------------------------------------------------------


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the closed openAPIV3Schema of every served version."""
    out = {}
    for path in sorted((VENDOR / "crds").glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=LOADER)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = closed(version["schema"]["openAPIV3Schema"])
                out[(f"{group}/{version['name']}", kind)] = schema
    return out


def closed(schema: Any) -> Any:
    """The schema with unknown fields rejected, as a structural schema prunes them: an
    object that lists properties (and does not say x-kubernetes-preserve-unknown-fields)
    admits no others. `metadata` of the resource itself is left to `check_metadata`."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k not in ("properties",) else {p: closed(s) for p, s in v.items()} for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


CRDS = crd_schemas()

OBJECT_META = {"name", "namespace", "labels", "annotations", "generateName"}
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_metadata(doc: dict[str, Any]) -> None:
    meta = doc.get("metadata")
    assert isinstance(meta, dict), "metadata must be an object"
    unknown = set(meta) - OBJECT_META
    assert not unknown, f"unknown metadata fields {sorted(unknown)}"
    assert NAME.match(meta.get("name", "")) and len(meta["name"]) <= 63, f"bad name {meta.get('name')!r}"
    for key in ("labels", "annotations"):
        assert all(isinstance(v, str) for v in meta.get(key, {}).values()), f"{key} values must be strings"


def validate(doc: dict[str, Any]) -> None:
    """Raise if the resource is not valid: a CRD kind against the vendored schema, a core
    kind with kubernetes-validate --strict."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRDS:
        check_metadata(doc)
        body = {k: v for k, v in doc.items() if k != "metadata"}
        jsonschema.validate(body, CRDS[key], cls=jsonschema.Draft4Validator)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def doc_id(entry: tuple[str, int, dict[str, Any]]) -> str:
    name, i, doc = entry
    return f"{name}#{i}-{doc.get('kind')}"


# --- every resource is valid --------------------------------------------------------


def test_the_vendored_release_is_pinned_with_its_licence():
    pin = (VENDOR / "VERSION").read_text()
    assert re.search(r"^tag: v\d+\.\d+\.\d+$", pin, re.M), pin
    assert re.search(r"^commit: [0-9a-f]{40}$", pin, re.M), pin
    assert "Apache License" in (VENDOR / "LICENSE").read_text()
    kinds = {kind for _, kind in CRDS}
    assert {"Sandbox", "SandboxTemplate", "SandboxWarmPool", "SandboxClaim"} <= kinds


def test_every_kind_the_issue_asks_for_is_there():
    kinds = [d["kind"] for _, _, d in DOCS]
    for kind in ("SandboxTemplate", "SandboxWarmPool", "SandboxClaim", "Deployment",
                 "NetworkPolicy", "PodDisruptionBudget", "Job", "RuntimeClass"):
        assert kind in kinds, f"deploy/kubernetes/ has no {kind}"
    # The agent-sandbox kinds are of a version the pinned release serves (its storage one).
    for kind in ("SandboxTemplate", "SandboxWarmPool", "SandboxClaim"):
        assert (one(kind)["apiVersion"], kind) in CRDS


@pytest.mark.parametrize("entry", DOCS, ids=doc_id)
def test_each_resource_validates(entry):
    _, _, doc = entry
    validate(doc)


# --- a broken copy of each fails ----------------------------------------------------


def breakages(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Broken copies of a resource: an unknown field at the top of spec, one deep inside
    (a misspelt key of the first container, the kind of typo that would otherwise be
    dropped in silence), and a value of the wrong type."""
    broken = copy.deepcopy(doc)
    target = broken.get("spec", broken)
    target["replicaz" if "spec" in broken else "handlerz"] = 1
    yield "unknown top-level field", broken

    containers = list(find_containers(doc))
    if containers:
        broken = copy.deepcopy(doc)
        first = next(find_containers(broken))
        first["imagePullPolicie"] = first.pop("imagePullPolicy", "IfNotPresent")
        yield "misspelt container field", broken
        broken = copy.deepcopy(doc)
        next(find_containers(broken))["ports"] = "8888"
        yield "ports given as a string", broken
    if doc["kind"] == "SandboxWarmPool":
        broken = copy.deepcopy(doc)
        broken["spec"]["replicas"] = "three"
        yield "replicas given as a string", broken
    if doc["kind"] == "SandboxClaim":
        broken = copy.deepcopy(doc)
        broken["spec"]["lifecycle"]["shutdownPolicy"] = "Keep"
        yield "a shutdownPolicy the CRD does not allow", broken
    if doc["kind"] == "NetworkPolicy":
        broken = copy.deepcopy(doc)
        broken["spec"]["ingress"][0]["form"] = broken["spec"]["ingress"][0].pop("from")
        yield "misspelt ingress field", broken


def find_containers(doc: Any) -> Iterator[dict[str, Any]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "containers" and isinstance(value, list):
                yield from value
            else:
                yield from find_containers(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from find_containers(item)


BROKEN = [
    (f"{doc_id(entry)}-{what.replace(' ', '-')}", broken)
    for entry in DOCS
    for what, broken in breakages(entry[2])
]


@pytest.mark.parametrize("broken", [b for _, b in BROKEN], ids=[i for i, _ in BROKEN])
def test_a_broken_copy_is_refused(broken):
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError, AssertionError)):
        validate(broken)


def test_an_unknown_metadata_field_of_a_crd_kind_is_refused():
    broken = copy.deepcopy(one("SandboxTemplate"))
    broken["metadata"]["lables"] = broken["metadata"].pop("labels")
    with pytest.raises(AssertionError, match="unknown metadata fields"):
        validate(broken)


# --- the files agree with each other and with the image -----------------------------


def image_env() -> dict[str, str]:
    """The ENV defaults of the Containerfile's final stage."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    final = text.split("\nFROM ")[-1]
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            for key, value in re.findall(r"(\w+)=(\S+)", line):
                env[key] = value
    return env


def cell_pod() -> dict[str, Any]:
    return one("SandboxTemplate")["spec"]["podTemplate"]


def cell_container() -> dict[str, Any]:
    (container,) = cell_pod()["spec"]["containers"]
    return container


def container_env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_cell_runs_behind_the_router_named_by_the_downward_api():
    env = {**image_env(), **container_env(cell_container())}
    assert env["MCP_SANDBOX_TRANSPORT"] == "http"
    assert env["MCP_SANDBOX_ROUTER_AUTH"] == "true"
    assert env["MCP_SANDBOX_CELL_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["MCP_SANDBOX_LISTEN"].startswith("0.0.0.0:")


def test_probes_ask_the_servers_own_endpoints_on_its_port():
    container = cell_container()
    port = int(container_env(container)["MCP_SANDBOX_LISTEN"].rsplit(":", 1)[1])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in named.values()
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert named.get(get["port"], get["port"]) == port, probe
        paths[probe] = get["path"]
    assert paths["livenessProbe"] == "/healthz"
    assert paths["readinessProbe"] == "/readyz"


def test_the_grace_period_outlasts_the_drain():
    drain = int({**image_env(), **container_env(cell_container())}["MCP_SANDBOX_DRAIN_SECONDS"])
    grace = cell_pod()["spec"]["terminationGracePeriodSeconds"]
    # The drain, then the stop (killing what is left, a few seconds at most).
    assert grace >= drain + 10, (grace, drain)
    assert grace <= one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] + 30


def test_state_and_workspace_are_on_the_volume_claim():
    env = image_env()
    template = one("SandboxTemplate")["spec"]
    (claim,) = template["volumeClaimTemplates"]
    (mount,) = cell_container()["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    for key in ("MCP_SANDBOX_STATE_DIR", "MCP_SANDBOX_WORKSPACE"):
        assert env[key].startswith(mount["mountPath"].rstrip("/") + "/"), (key, env[key])
    assert template["volumeClaimTemplatesPolicy"] == "Disallowed"
    assert template["envVarsInjectionPolicy"] == "Disallowed"


def gib(quantity: str) -> float:
    if quantity.isdigit():
        return int(quantity) / 2**30
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1, "TiB": 2**10}
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i(?:B)?)", quantity).groups()
    return float(number) * units[unit]


def test_the_disk_bounds_fit_the_volume_with_room_for_the_workspace():
    env = container_env(cell_container())
    (claim,) = one("SandboxTemplate")["spec"]["volumeClaimTemplates"]
    volume = gib(claim["spec"]["resources"]["requests"]["storage"])
    stores, output = gib(env["MCP_SANDBOX_ENV_DISK_TOTAL"]), gib(env["MCP_SANDBOX_DISK_CAP"])
    assert gib(env["MCP_SANDBOX_ENV_DISK_CAP"]) <= stores
    # What the server bounds leaves at least a quarter of the volume to the workspace.
    assert stores + output <= 0.75 * volume, (stores, output, volume)


def test_the_server_accepts_the_templates_environment(tmp_path):
    """Every MCP_SANDBOX_* value the image and the template set parses (the server's own
    checks: a value it refuses would crash-loop every cell). `policy show` parses the
    server's flags and their environment twins, then prints and exits."""
    from conftest import binary

    env = {k: v for k, v in container_env(cell_container()).items() if isinstance(v, str)}
    env = {**image_env(), **env, "MCP_SANDBOX_CELL_ID": "cell-a"}
    env = {k: v for k, v in env.items() if k.startswith("MCP_SANDBOX_")}
    env |= {"MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"), "MCP_SANDBOX_WORKSPACE": str(tmp_path)}

    def policy_show(extra):
        return subprocess.run([binary(), "policy", "show", "read-only"],
                              env={"PATH": os.environ["PATH"], **env, **extra},
                              capture_output=True, text=True, timeout=60)

    out = policy_show({})
    assert out.returncode == 0, out.stderr
    out = policy_show({"MCP_SANDBOX_DISK_CAP": "2 gigs"})  # the check does check
    assert out.returncode != 0 and "disk-cap" in out.stderr, out.stderr


def test_runtime_class_and_names_refer_to_what_exists():
    runtime = one("RuntimeClass")["metadata"]["name"]
    assert cell_pod()["spec"]["runtimeClassName"] == runtime
    assert one("Job")["spec"]["template"]["spec"]["runtimeClassName"] == runtime
    template = one("SandboxTemplate")["metadata"]["name"]
    pool = one("SandboxWarmPool")
    assert pool["spec"]["sandboxTemplateRef"]["name"] == template
    assert one("SandboxClaim")["spec"]["warmPoolRef"]["name"] == pool["metadata"]["name"]
    namespace = one("Namespace")["metadata"]["name"]
    for _, _, doc in DOCS:
        if doc["kind"] not in ("Namespace", "RuntimeClass"):
            assert doc["metadata"].get("namespace") == namespace, doc["metadata"]["name"]


def test_the_router_is_in_scoped_token_mode_and_reaches_cells_by_name():
    router = one("Deployment")
    (container,) = router["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--authz-mode=scoped-token" in args
    secret_file = next(a.split("=", 1)[1] for a in args if a.startswith("--authz-scoped-token-secret-file="))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert str(Path(secret_file).parent) in mounts
    assert one("SandboxTemplate")["spec"]["service"] is True  # DNS: <sandbox>.<ns>.svc
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= router["spec"]["template"]["metadata"]["labels"].items()


def test_the_network_policy_admits_only_the_router_and_reaches_only_dns_and_the_index():
    policy = one("NetworkPolicy")["spec"]
    cell_labels = cell_pod()["metadata"]["labels"]
    router_labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= cell_labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert one("SandboxTemplate")["spec"]["networkPolicyManagement"] == "Unmanaged"
    (ingress,) = policy["ingress"]
    (source,) = ingress["from"]
    assert set(source) == {"podSelector"}
    assert source["podSelector"]["matchLabels"].items() <= router_labels.items()
    port = int(container_env(cell_container())["MCP_SANDBOX_LISTEN"].rsplit(":", 1)[1])
    assert [p["port"] for p in ingress["ports"]] == [port]
    dns, index = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert {p["port"] for p in index["ports"]} == {443}
    assert all(set(peer) == {"ipBlock"} for peer in index["to"])


def test_the_ci_job_runs_the_ci_policy():
    (container,) = one("Job")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "run" and "--policy=ci" in args and "--" in args
    assert one("Job")["spec"]["template"]["spec"]["restartPolicy"] == "Never"
