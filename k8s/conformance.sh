#!/usr/bin/env bash
# Runs the upstream Kubernetes e2e suites against a real cluster on this machine: the
# control plane, two nodes (three, a zone each, for `other`) with containerd and a kubelet
# each, and nodus as the nodes' only network component (service proxy, DNS, WireGuard mesh
# and CNI, NetworkPolicy), installed from deploy/overlays/replace: its DaemonSet runs an
# image of the static binary (built if NODUS_IMAGE_BINARY names none) that each node
# imported. Everything is built from the modules k8s/go.mod pins (k8s/build.sh,
# k8s/images.sh) and torn down at the end, also after a Ctrl-C. Prints passed, failed and
# skipped, and the wall time; the JUnit report stays.
#
#   k8s/conformance.sh SUITE [REPORT_DIR]     (as root; REPORT_DIR: /tmp/nodus-e2e-SUITE)
#
# SUITE: conformance ([sig-network] ... [Conformance]), services, dns, networking, other
# (the rest of [sig-network]: Conntrack, EndpointSlice, Proxy, HostPort, Traffic
# Distribution, ...), netpol (NetworkPolicy), or smoke (the ten specs
# `cargo test` runs too).
#
# Skipped everywhere, each for a reason of this machine or of nodus:
#   SCTP                      this kernel has no SCTP
#   LoadBalancer|ExternalIP   no cloud provider, no load balancer
#   Serial|Disruptive|Flaky   specs that stop nodes or need the whole cluster alone
#   IPerf2|Networking-Performance|PerformanceDNS   throughput benches, not behaviour
#   DualStack|IPv6            the nodes have IPv4 addresses only (pods get both families)
#   KubeProxy|kube-proxy      kube-proxy's own binary and flags; nodus replaces it
#   Feature:                  optional features (NetworkPolicy has its own suite: netpol)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
suite=${1:?"usage: k8s/conformance.sh conformance|services|dns|networking|other|netpol|smoke [REPORT_DIR]"}
report=${2:-/tmp/nodus-e2e-$suite}
skip='SCTP|LoadBalancer|ExternalIP|\[Serial\]|\[Disruptive\]|\[Flaky\]|IPerf2|Networking-Performance|PerformanceDNS|DualStack|IPv6|KubeProxy|kube-proxy|\[Feature:'
case $suite in
    conformance) focus='\[sig-network\].*\[Conformance\]' ;;
    services) focus='\[sig-network\] Services' ;;
    dns) focus='\[sig-network\] DNS' ;;
    networking) focus='\[sig-network\] Networking' ;;
    other)
        focus='\[sig-network\]'
        skip+='|\[sig-network\] (Services|DNS|Networking|Netpol)'
        nodes=3 ;; # a zone each: the traffic distribution specs want three
    netpol)
        focus='\[sig-network\] Netpol'
        skip='SCTP|\[Serial\]|\[Disruptive\]|\[Flaky\]' ;;
    smoke) focus='' skip='' ;; # the runner's own list (tests/e2e/real_nodes.rs SMOKE_SPECS)
    *) echo "k8s/conformance.sh: unknown suite $suite" >&2; exit 2 ;;
esac
bin=$("$here/build.sh" kubelet containerd containerd-shim-runc-v2 ctr agnhost e2e.test kubectl)
"$here/build.sh" >/dev/null
"$here/images.sh" >/dev/null
rm -rf "$report"
mkdir -p "$report"
start=$SECONDS
status=0
(cd "$here/.." && NODUS_K8S_BIN=$bin NODUS_E2E_FOCUS=$focus NODUS_E2E_SKIP=$skip \
    NODUS_E2E_NODES=${nodes:-2} NODUS_E2E_REPORT_DIR=$report \
    cargo test --test e2e real_nodes::upstream_e2e_suite -- --ignored --nocapture) \
    >"$report/run.log" 2>&1 || status=$?
wall=$((SECONDS - start))
python3 - "$report" "$suite" "$wall" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
report, suite, wall = sys.argv[1], sys.argv[2], int(sys.argv[3])
passed = failed = skipped = 0
failures = []
for path in glob.glob(f"{report}/junit*.xml"):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It]"):
            continue
        skip = case.find("skipped")
        if skip is not None:
            # A spec the focus left out says just "skipped"; one that skipped itself says why.
            if skip.get("message", "") != "skipped":
                skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(name)
        else:
            passed += 1
print(f"{suite}: {passed} passed, {failed} failed, {skipped} skipped in {wall // 60} min {wall % 60} s")
for name in failures:
    print(f"  failed: {name}")
PY
echo "report and log: $report"
exit $status
