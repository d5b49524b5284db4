//! The heap benchmark as a test: it fails when the view is over its memory budget.

#[path = "../benches/heap.rs"]
mod heap;

fn main() {
    heap::main();
}
