//! The view's heap, measured with a counting allocator.
//!
//! Builds the view from the scale bench's generated clusters (the same JSON a real API
//! server would send, decoded through the same lean wire structs), then churns it, and
//! prints the bytes the view keeps live. Fails if the 10,000 × 10 × 100 view exceeds its
//! 8 MiB budget: that is a size, not a timing, so it is checked wherever this runs.

use nodus_testbed::heap::{self, Counting};
use nodus_testbed::scale::{self, Shape};
use nodus_view::View;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const BUDGET_BYTES: usize = 8 << 20;

/// Applies `objects` a page at a time (the watcher's page size), so that no more than one
/// page of wire objects is alive beside the view.
fn apply_in_pages(view: &mut View, objects: impl Iterator<Item = serde_json::Value>) {
    scale::apply_in_pages(view, objects).expect("the generated objects are valid");
}

/// The view's heap after the initial lists, after `churn` slice updates, and what this
/// node's 110 pods add to it.
fn measure(shape: Shape, churn: usize) -> (usize, usize, usize) {
    let before = heap::live();
    // Every Node is in the view, as when the mesh is on: the larger case.
    let mut view = View::new(&scale::node_name(0));
    apply_in_pages(&mut view, scale::cluster(&shape));
    let synced = heap::live() - before;
    apply_in_pages(
        &mut view,
        (0..churn).map(|k| scale::slice(k % shape.services, &shape, k / shape.services + 1)),
    );
    let churned = heap::live() - before;
    // This node's pods, for DNS autopath, over the view of the cluster.
    let pods =
        (0..scale::PODS_PER_NODE).map(|k| scale::pod(0, k, &scale::namespace(k % shape.services)));
    let without = heap::live();
    apply_in_pages(&mut view, pods);
    let pods = heap::live() - without;
    let counts = view.counts();
    assert_eq!(counts.pods, scale::PODS_PER_NODE);
    assert_eq!(counts.services, shape.services);
    assert_eq!(
        counts.endpoints,
        shape.services * shape.endpoints_per_service
    );
    drop(view);
    (synced, churned, pods)
}

/// The view saved and restored ([`View::save`], [`View::restore`]): the file's size, the
/// time each takes, and the restored view's heap beside the original's.
fn snapshot(shape: Shape) {
    let mut view = View::new(&scale::node_name(0));
    apply_in_pages(&mut view, scale::cluster(&shape));
    let started = Instant::now();
    let bytes = view.save().expect("the view fits a snapshot");
    let saved = started.elapsed();
    let before = heap::live();
    let started = Instant::now();
    let restored = View::restore(&scale::node_name(0), &bytes).expect("restore");
    let took = started.elapsed();
    let heap = heap::live() - before;
    assert_eq!(restored.counts(), view.counts());
    println!(
        "{:<14} {:>10.2} MiB {:>9.1} ms {:>10.1} ms {:>10.2} MiB",
        format!(
            "{}×{}×{}",
            shape.services, shape.endpoints_per_service, shape.nodes
        ),
        bytes.len() as f64 / (1 << 20) as f64,
        saved.as_secs_f64() * 1000.0,
        took.as_secs_f64() * 1000.0,
        heap as f64 / (1 << 20) as f64,
    );
}

pub fn main() {
    println!("node view heap (live bytes, counting allocator)");
    println!(
        "{:<14} {:>14} {:>16} {:>12} {:>14}",
        "shape S×E×N", "after sync", "after 1000 churn", "per endpoint", "110 pods"
    );
    let mut over_budget = false;
    // The last is the footprint bench's largest shape, whose peak is over its goal.
    for (services, endpoints, nodes) in [
        (100, 3, 3),
        (1000, 10, 100),
        (10_000, 10, 100),
        (50_000, 5, 1000),
    ] {
        let shape = Shape::new(services, endpoints, nodes);
        let (synced, churned, pods) = measure(shape, 1000);
        println!(
            "{:<14} {:>10.2} MiB {:>12.2} MiB {:>10} B {:>10.1} KiB",
            format!("{services}×{endpoints}×{nodes}"),
            synced as f64 / (1 << 20) as f64,
            churned as f64 / (1 << 20) as f64,
            synced / (services * endpoints),
            pods as f64 / 1024.0,
        );
        if services == 10_000 && synced.max(churned) > BUDGET_BYTES {
            over_budget = true;
        }
    }
    println!("\nview snapshot (the warm start's file)");
    println!(
        "{:<14} {:>14} {:>12} {:>13} {:>14}",
        "shape S×E×N", "file", "save", "restore", "restored heap"
    );
    for (services, endpoints, nodes) in [(1000, 10, 100), (10_000, 10, 100)] {
        snapshot(Shape::new(services, endpoints, nodes));
    }
    if over_budget {
        eprintln!("the 10,000 × 10 × 100 view is over its 8 MiB budget");
        std::process::exit(1);
    }
}
