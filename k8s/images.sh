#!/usr/bin/env bash
# Makes the container images a real node of the test bed runs, without a registry: OCI
# image archives built from what is on this machine, named as upstream names them, for
# `ctr -n k8s.io images import`. Prints the directory that holds them.
#
#   pause.tar     registry.k8s.io/pause: Kubernetes's pause.c (from the module k8s/go.mod
#                 pins), linked statically
#   debian-<digest>.tar  registry.k8s.io/e2e-test-images/ agnhost, glibc-dns-testing,
#                 busybox and nginx, registry.k8s.io/kube-proxy and coredns/coredns: one
#                 minimal Debian 12 (debootstrap) with the agnhost, kube-proxy and CoreDNS
#                 binaries k8s/build.sh built and the tools the e2e suites run in these images
#   regression-issue-74839.tar   that e2e image's program, built from the module
#
# The tags are those of the e2e framework's image manifest for this Kubernetes version
# (test/utils/image/manifest.go; `e2e.test --list-images` prints the same). The
# archives live beside the binaries (k8s/build.sh's cache directory, keyed by version);
# one already made is not made again, and an interrupted run leaves no half archive.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/build.sh" agnhost)
out=$bin/../images
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

modcache=$(cd "$here" && GOTOOLCHAIN=local go env GOMODCACHE)
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2 } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$here/go.mod" | head -n 1)
source_dir=$modcache/k8s.io/kubernetes@$version
# The tag the e2e framework gives an image: `configs[Pause] = Config{…, "pause", "3.10.2"}`.
manifest=$source_dir/test/utils/image/manifest.go
tag_of() { # the image's key in the manifest
    sed -n "s/^\tconfigs\[$1\] = Config{[^,]*, \"[^\"]*\", \"\([^\"]*\)\"}.*/\1/p" "$manifest"
}

e2e=registry.k8s.io/e2e-test-images
pause_tag=$(tag_of Pause)
agnhost_tag=$(tag_of Agnhost)
glibc_dns_tag=$(tag_of GlibcDnsTesting)
busybox_tag=$(tag_of BusyBox)
nginx_tag=$(tag_of Nginx)
regression_tag=$(tag_of RegressionIssue74839)
for tag in "$pause_tag" "$agnhost_tag" "$glibc_dns_tag" "$busybox_tag" "$nginx_tag" "$regression_tag"; do
    [[ -n $tag ]] || { echo "images.sh: an image's tag is missing from $manifest" >&2; exit 1; }
done
if [[ ! -s $out/pause.tar ]]; then
    rootfs=$(mktemp -d "$out/.rootfs.XXXXXX")
    gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-nodus" \
        -o "$rootfs/pause" "$source_dir/build/pause/linux/pause.c"
    strip "$rootfs/pause"
    "$here/oci-archive.sh" "$rootfs" "$out/pause.tar" "registry.k8s.io/pause:$pause_tag" '"Entrypoint":["/pause"]'
    rm -rf "$rootfs"
fi

# The Debian archive is named by this script's digest: a change here makes it again, and
# the archives of earlier versions go (agnhost.tar was the first).
debian=$out/debian-$(sha256sum "$0" | cut -c1-12).tar
for old in "$out"/agnhost.tar "$out"/debian*.tar; do
    [[ -e $old && $old != "$debian" ]] && rm -f "$old"
done
if [[ ! -s $debian ]]; then
    # One minimal Debian 12 (debootstrap) serves five upstream images, each with the
    # tools the e2e suites run in it:
    #   agnhost            curl, wget, nc, socat, dig, ip, ping, /coredns (the DNS specs' own
    #                      servers), porter's TLS key pair and the user and group the image
    #                      defines, as upstream's Dockerfile adds them (upstream: Alpine)
    #   glibc-dns-testing  dig and glibc's resolver (upstream: Debian 12 with dnsutils)
    #   busybox            sh, sleep, nc (upstream: busybox; the specs run only those)
    #   nginx              nginx serving on port 80 (upstream: nginx on Alpine)
    #   kube-proxy         /usr/local/bin/kube-proxy of this Kubernetes version, and the
    #                      nft its nftables mode runs (upstream: distroless with iptables
    #                      and nft), for the migration test's kubeadm-shaped cluster
    #   coredns/coredns    /coredns, CoreDNS built from its module (k8s/coredns/go.mod): the
    #                      same test's cluster DNS (upstream: distroless)
    command -v debootstrap >/dev/null || { echo "images.sh: debootstrap is not installed" >&2; exit 1; }
    rootfs=$(mktemp -d "$out/.rootfs.XXXXXX")
    if ! debootstrap --variant=minbase \
        --include=curl,netcat-openbsd,bind9-dnsutils,iproute2,iputils-ping,ca-certificates,socat,wget,nginx-light,nftables \
        bookworm "$rootfs" http://deb.debian.org/debian >"$out/.debootstrap.log" 2>&1; then
        tail -n 20 "$out/.debootstrap.log" >&2
        exit 1
    fi
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale} "$rootfs"/var/cache/apt/* \
        "$rootfs"/var/lib/apt/lists/*
    cp "$bin/agnhost" "$rootfs/agnhost"
    cp "$source_dir/test/images/agnhost/porter/localhost.crt" \
        "$source_dir/test/images/agnhost/porter/localhost.key" "$rootfs/"
    mkdir "$rootfs/uploads"
    chroot "$rootfs" sh -e -c 'useradd -u 1000 -M user-defined-in-image
        groupadd -g 50000 group-defined-in-image
        usermod -a -G group-defined-in-image user-defined-in-image'
    ln -s agnhost "$rootfs/agnhost-2"
    install -D "$("$here/build.sh" kube-proxy)/kube-proxy" "$rootfs/usr/local/bin/kube-proxy"
    coredns_bin=$("$here/build.sh" coredns)
    cp "$coredns_bin/coredns" "$rootfs/coredns"
    coredns_version=$("$coredns_bin/coredns" -version | sed -n 's/^CoreDNS-//p')
    "$here/oci-archive.sh" "$rootfs" "$debian" \
        "$e2e/agnhost:$agnhost_tag" '"Entrypoint":["/agnhost"],"Cmd":["pause"]' \
        "$e2e/glibc-dns-testing:$glibc_dns_tag" '"Cmd":["/bin/bash"]' \
        "$e2e/busybox:$busybox_tag" '"Cmd":["sh"]' \
        "$e2e/nginx:$nginx_tag" '"Entrypoint":["nginx","-g","daemon off;"],"StopSignal":"SIGQUIT"' \
        "registry.k8s.io/kube-proxy:$version" '"Entrypoint":["/usr/local/bin/kube-proxy"]' \
        "registry.k8s.io/coredns/coredns:v$coredns_version" '"Entrypoint":["/coredns"]'
    rm -rf "$rootfs"
fi

if [[ ! -s $out/regression-issue-74839.tar ]]; then
    # The conntrack spec's client that sends an out-of-window TCP packet: a Go program of
    # the module's, alone in its image as upstream has it.
    rootfs=$(mktemp -d "$out/.rootfs.XXXXXX")
    cp "$("$here/build.sh" regression-issue-74839)/regression-issue-74839" "$rootfs/"
    "$here/oci-archive.sh" "$rootfs" "$out/regression-issue-74839.tar" \
        "$e2e/regression-issue-74839:$regression_tag" '"Entrypoint":["/regression-issue-74839"]'
    rm -rf "$rootfs"
fi
echo "$(cd "$out" && pwd)"
