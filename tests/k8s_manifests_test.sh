#!/usr/bin/env bash
# ctest k8s_manifests_test: every manifest under deploy/k8s validates against
# the Kubernetes API schemas (deploy/k8s/validate/check.mjs), and the
# validator refuses broken copies of them: a wrong type, a field the API
# does not have, a missing required field, a kind it has no schema for.
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
K8S="$SRC/deploy/k8s"
CHECK=(node "$K8S/validate/check.mjs")
WORK="$(mktemp -d /tmp/kvpool-k8s-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "k8s_manifests_test: FAIL: $*" >&2; exit 1; }

mapfile -t manifests < <(find "$K8S" -name '*.yaml' -not -path '*/node_modules/*' | sort)
[[ ${#manifests[@]} -ge 7 ]] || fail "expected the deploy/k8s manifests, found ${#manifests[@]}"
"${CHECK[@]}" "${manifests[@]}" || fail "the manifests do not validate"

# broken NAME SED_EXPRESSION FILE EXPECTED_MESSAGE: a copy of FILE changed by
# the expression must be refused with a message naming the problem.
broken() {
  local name="$1" expr="$2" file="$3" want="$4" out rc=0
  sed "$expr" "$K8S/$file" > "$WORK/$name.yaml"
  cmp -s "$K8S/$file" "$WORK/$name.yaml" && fail "$name: the edit changed nothing"
  out="$("${CHECK[@]}" "$WORK/$name.yaml" 2>&1)" || rc=$?
  [[ $rc -eq 1 ]] || fail "$name: exit $rc, expected 1 (output: $out)"
  grep -q -- "$want" <<< "$out" || fail "$name: no '$want' in: $out"
  echo "refused as expected: $name: $(grep FAIL <<< "$out" | head -n 1)"
}
broken wrong-type 's/containerPort: 9710/containerPort: "admin-port"/' 40-daemonset.yaml \
  "must be integer"
broken unknown-field 's/imagePullPolicy: IfNotPresent/imagePullPolicyy: IfNotPresent/' \
  40-daemonset.yaml "imagePullPolicyy"
broken missing-selector '/^  selector:$/,/^      app.kubernetes.io\/name: kvpool-node$/d' \
  40-daemonset.yaml "selector"
broken misplaced-field 's/^      hostNetwork: true/      hostNetworking: true/' 40-daemonset.yaml \
  "hostNetworking"
broken unknown-kind 's/^kind: ConfigMap/kind: ConfigMapp/' 20-configmap.yaml "no schema"
broken bad-monitor 's/interval: 15s/intervall: 15s/' 50-metrics.yaml "intervall"
echo "k8s_manifests_test: ok"
