#!/usr/bin/env bash
# Builds the Kubernetes components of nodus's test bed from the modules pinned in k8s/go.mod
# (Kubernetes), k8s/etcd/go.mod (etcd) and k8s/containerd/go.mod (containerd), into a cache
# keyed by version, and prints the cache's bin directory. A component already in the cache
# is not built again, so a second run costs nothing; an interrupted build leaves nothing
# half-written behind (each binary is linked under a temporary name and renamed).
#
#   k8s/build.sh                 the control plane: etcd kube-apiserver kube-controller-manager
#                                kube-scheduler kubectl
#   k8s/build.sh all             and kubelet, kube-proxy, agnhost, regression-issue-74839 (an
#                                e2e image's program), e2e.test, and containerd
#                                (containerd, its runc shim, ctr) for real nodes
#   k8s/build.sh kubelet ...     only those named
#   k8s/build.sh cni             the reference CNI plugins (host-local, portmap, loopback) and
#                                cnitool from k8s/cni/go.mod, into a directory of their own
#                                (cni-<plugins version>-<digest>/bin), printed instead
#   k8s/build.sh coredns         CoreDNS from k8s/coredns/go.mod (the cluster DNS of the
#                                migration test), likewise into coredns-<version>-<digest>/bin
#
# NODUS_K8S_CACHE (default /var/cache/nodus-k8s) holds one directory per version and
# go.sum digest: kubernetes-v1.37.2-<digest>/bin. Go's own module and build caches are
# used as they are (GOMODCACHE, GOCACHE).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# go.mod and go.sum are complete (go mod tidy): a build never changes them.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly

control_plane=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
cni=(host-local portmap loopback cnitool)
all=("${control_plane[@]}" kubelet kube-proxy agnhost regression-issue-74839 e2e.test containerd
    containerd-shim-runc-v2 ctr)
case "${1:-}" in
    "") wanted=("${control_plane[@]}") ;;
    cni) wanted=("${cni[@]}") ;;
    coredns) wanted=(coredns) ;;
    all) wanted=("${all[@]}") ;;
    *) wanted=("$@") ;;
esac

module_version() { # module go.mod
    awk -v m="$1" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$2" | head -n 1
}
version=$(module_version k8s.io/kubernetes "$here/go.mod")
etcd_version=$(module_version go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")
containerd_version=$(module_version github.com/containerd/containerd/v2 "$here/containerd/go.mod")
digest=$(cat "$here/go.sum" "$here/etcd/go.sum" "$here/containerd/go.sum" | sha256sum | cut -c1-12)
bin=${NODUS_K8S_CACHE:-/var/cache/nodus-k8s}/kubernetes-$version-$digest/bin
if [[ ${1:-} == cni ]]; then
    # Not Kubernetes: a cache of their own, so that neither invalidates the other.
    plugins_version=$(module_version github.com/containernetworking/plugins "$here/cni/go.mod")
    cni_digest=$(sha256sum <"$here/cni/go.sum" | cut -c1-12)
    bin=${NODUS_K8S_CACHE:-/var/cache/nodus-k8s}/cni-$plugins_version-$cni_digest/bin
    version=$plugins_version
elif [[ ${1:-} == coredns ]]; then
    version=$(module_version github.com/coredns/coredns "$here/coredns/go.mod")
    coredns_digest=$(sha256sum <"$here/coredns/go.sum" | cut -c1-12)
    bin=${NODUS_K8S_CACHE:-/var/cache/nodus-k8s}/coredns-$version-$coredns_digest/bin
fi
mkdir -p "$bin"
# One build at a time (tests and the sandbox may ask at once); the second finds the cache.
exec 9>"$bin/../build.lock"
flock 9

# The version every component reports (kubectl version, the Node's kubeletVersion, /version),
# stamped as Kubernetes's own build stamps it (hack/lib/version.sh).
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=module-$version"
    ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # name
    local name=$1 out="$bin/.$1.partial"
    case $name in
        etcd)
            (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$out" go.etcd.io/etcd/server/v3) ;;
        host-local | portmap | loopback | cnitool)
            local package=github.com/containernetworking/cni/cnitool
            case $name in
                host-local) package=github.com/containernetworking/plugins/plugins/ipam/host-local ;;
                portmap) package=github.com/containernetworking/plugins/plugins/meta/portmap ;;
                loopback) package=github.com/containernetworking/plugins/plugins/main/loopback ;;
            esac
            (cd "$here/cni" && go build -trimpath -ldflags "-s -w" -o "$out" "$package") ;;
        coredns)
            (cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$out" github.com/coredns/coredns) ;;
        containerd | containerd-shim-runc-v2 | ctr)
            (cd "$here/containerd" &&
                go build -trimpath -ldflags "-s -w" -o "$out" "github.com/containerd/containerd/v2/cmd/$name") ;;
        agnhost | regression-issue-74839)
            (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out" "k8s.io/kubernetes/test/images/$name") ;;
        e2e.test)
            # A test binary of a dependency's package: its test-only imports are required
            # through k8s/e2e.go.
            (cd "$here" && go test -c -trimpath -ldflags "$ldflags" -o "$out" k8s.io/kubernetes/test/e2e) ;;
        kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet | kube-proxy)
            (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out" "k8s.io/kubernetes/cmd/$name") ;;
        *)
            echo "k8s/build.sh: no component named $name (known: ${all[*]} ${cni[*]})" >&2
            return 2 ;;
    esac
    mv -f "$out" "$bin/$name"
}

for name in "${wanted[@]}"; do
    [[ -x $bin/$name ]] && continue
    case $name in
        etcd) of=$etcd_version ;;
        containerd | containerd-shim-runc-v2 | ctr) of=$containerd_version ;;
        cnitool) of=$(module_version github.com/containernetworking/cni "$here/cni/go.mod") ;;
        coredns) of=$version ;;
        *) of=$version ;;
    esac
    echo "k8s/build.sh: building $name ($of)" >&2
    start=$SECONDS
    build "$name"
    echo "k8s/build.sh: $name built in $((SECONDS - start)) s" >&2
done
echo "$bin"
