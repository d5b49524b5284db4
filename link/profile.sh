#!/bin/sh
# Makes link/hot-functions.order again from a profile of the binary the image ships: the
# footprint bench at 10,000 × 10 × 100 with two ports per Service (TCP and UDP), without and then with NetworkPolicy, every one of its
# phases (cold start, Node and endpoint updates, DNS questions, a relist, other programs'
# nftables commits, policy changes, a restart) under nodus-trace-functions, then once more
# with a subscriber of the view. About 20 minutes,
# as root. Run it after a dependency or the toolchain changes: a function's name carries a
# hash of its crate's build settings, and names the build no longer has are ignored.
set -eu
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/nodus-profile-XXXXXX)
trap 'rm -rf "$work"' EXIT
binary=target/x86_64-unknown-linux-gnu/release/nodus
NODUS_LINK_MAP="$work/nodus.map" RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked --target x86_64-unknown-linux-gnu --bin nodus \
  --no-default-features --features jemalloc
cargo build --release --locked -p nodus-testbed --bin nodus-trace-functions
cat > "$work/nodus" <<WRAPPER
#!/bin/sh
exec $PWD/target/release/nodus-trace-functions --map $work/nodus.map --out $work/functions \
  -- $PWD/$binary "\$@"
WRAPPER
chmod +x "$work/nodus"
# Two ports per Service (TCP and UDP): the UDP paths run too.
cargo bench --bench footprint -- --shape 10000x10x100:2 --policy 10000x200x100 --nodus "$work/nodus"
# Then with a subscriber of the view: what only subscribers run is listed after everything
# else, so that an agent nobody subscribes to maps none of it.
cargo bench --bench footprint -- --shape 10000x10x100 --subscribers 1 --nodus "$work/nodus"
{
  echo "# Functions nodus ran in a profile, in the order they first ran (link/profile.sh)."
  echo "# The linker lays them out in this order at the start of the code (build.rs)."
  # Each agent the bench started wrote one file; in the order they ran, each name once.
  ls -tr "$work"/functions/*.txt | xargs cat | awk '!seen[$0]++'
} > link/hot-functions.order
echo "link/hot-functions.order: $(grep -vc '^#' link/hot-functions.order) functions"
